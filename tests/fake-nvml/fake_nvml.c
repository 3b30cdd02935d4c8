/*
 * A fake libnvidia-ml.so.1 for kiln's tests: it serves the machine described by the fixture file
 * named in $KILN_FAKE_NVML_FIXTURE, through the subset of NVML that kiln (via nvml-wrapper 0.13)
 * calls. Fields a fixture leaves out answer NVML_ERROR_NOT_SUPPORTED, as a real driver does for
 * features a GPU lacks.
 *
 * Fixture format, one item per line ("#" starts a comment):
 *   init_error <nvmlReturn_t>      make nvmlInit fail (9 = NVML_ERROR_DRIVER_NOT_LOADED)
 *   driver <version> | nvml <version> | cuda <int, 12070 = 12.7>
 *   gpu                            starts a GPU; the keys below apply to the latest one
 *   name|uuid|serial|board_part|vbios|bus_id <text to end of line>
 *   pci_device_id <hex u32> | pci_subsystem_id <hex u32> | memory_total <bytes>
 *   cc <major> <minor> | arch <nvmlDeviceArchitecture_t> | ecc <current> <pending>
 *   ecc_errors <volatile_corr> <volatile_uncorr> <aggregate_corr> <aggregate_uncorr>
 *   remapped <corr> <uncorr> <pending> <failure> | retired <single_bit> <double_bit>
 *   power <default_mW> <enforced_mW> <min_mW> <max_mW> | clocks <max_sm_MHz> <max_mem_MHz>
 *   pcie <cur_gen> <max_gen> <cur_width> <max_width> | persistence <0|1> | mig <cur> <pending>
 *   temp <C> | pcie_replay <count> | numa <node>
 *   recovery <nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset>
 *   drained <0|1>                  (nvmlDeviceQueryDrainState, found by the GPU's bus id) | affinity <cpu list, e.g. 0-19,40-59>
 *   nvlink <link> <active> <version> <remote bus id|-> <remote type: 0 gpu, 1 npu, 2 switch>
 *   nvlink_errors <link> <replay> <recovery> <crc_flit> <crc_data>
 *   fabric <state 0-3> <status, an nvmlReturn_t>   (nvmlDeviceGetGpuFabricInfo; absent: not supported)
 *   load <power_mW> <sm_MHz> <mem_MHz> <util_gpu_%> <util_mem_%> <throttle reasons, hex bitmask>
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7, UNKNOWN = 999
};

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define MAX_GPUS 64
#define MAX_LINKS 18
#define TEXT 96

struct link {
    int present, active;
    unsigned int version;
    char remote[TEXT];
    int remote_type;
    int has_errors;
    unsigned long long errors[4];
};

struct gpu {
    unsigned int index;
    char name[TEXT], uuid[TEXT], serial[TEXT], board_part[TEXT], vbios[TEXT], bus_id[TEXT];
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long memory_total;
    int has_cc, cc_major, cc_minor;
    int has_arch; unsigned int arch;
    int has_ecc, ecc_current, ecc_pending;
    int has_ecc_errors; unsigned long long ecc_errors[4];
    int has_remapped; unsigned int remapped[4];
    int has_retired; unsigned int retired[2];
    int has_power; unsigned int power[4];
    int has_clocks; unsigned int clocks[2];
    int has_pcie; unsigned int pcie[4];
    int has_persistence, persistence;
    int has_mig; unsigned int mig[2];
    int has_temp; unsigned int temp;
    int has_replay; unsigned int replay;
    int has_recovery; unsigned int recovery;
    int has_drain; int drained;
    int has_numa; unsigned int numa;
    int has_affinity; unsigned long affinity[16];
    struct link links[MAX_LINKS];
    int has_fabric; unsigned int fabric_state, fabric_status;
    int has_load;
    unsigned int power_mw, sm_mhz, mem_mhz, util_gpu, util_mem;
    unsigned long long throttle;
};

static struct gpu gpus[MAX_GPUS];
static unsigned int gpu_count;
static char driver[TEXT], nvml_version[TEXT];
static int cuda_version = -1;
static int initialized;

static void rest_of_line(char *dst, const char *src) {
    while (*src == ' ' || *src == '\t') src++;
    snprintf(dst, TEXT, "%s", src);
    size_t n = strlen(dst);
    while (n && (dst[n - 1] == '\n' || dst[n - 1] == '\r' || dst[n - 1] == ' ')) dst[--n] = 0;
}

static void parse_affinity(struct gpu *g, const char *list) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *tok = strtok(buf, ", \n"); tok; tok = strtok(NULL, ", \n")) {
        unsigned a, b;
        int n = sscanf(tok, "%u-%u", &a, &b);
        if (n == 1) b = a;
        if (n < 1) continue;
        for (unsigned c = a; c <= b && c < 16 * 8 * sizeof(unsigned long); c++)
            g->affinity[c / (8 * sizeof(unsigned long))] |= 1UL << (c % (8 * sizeof(unsigned long)));
    }
    g->has_affinity = 1;
}

static nvmlReturn_t load(void) {
    const char *path = getenv("KILN_FAKE_NVML_FIXTURE");
    if (!path) return UNKNOWN;
    FILE *f = fopen(path, "r");
    if (!f) return UNKNOWN;
    char line[1024], key[64];
    int init_error = 0;
    struct gpu *g = NULL;
    memset(gpus, 0, sizeof gpus);
    gpu_count = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "%63s", key) != 1) continue;
        const char *arg = line + strlen(key);
        if (!strcmp(key, "init_error")) init_error = atoi(arg);
        else if (!strcmp(key, "driver")) rest_of_line(driver, arg);
        else if (!strcmp(key, "nvml")) rest_of_line(nvml_version, arg);
        else if (!strcmp(key, "cuda")) cuda_version = atoi(arg);
        else if (!strcmp(key, "gpu")) {
            if (gpu_count == MAX_GPUS) break;
            g = &gpus[gpu_count];
            g->index = gpu_count++;
        } else if (!g) continue;
        else if (!strcmp(key, "name")) rest_of_line(g->name, arg);
        else if (!strcmp(key, "uuid")) rest_of_line(g->uuid, arg);
        else if (!strcmp(key, "serial")) rest_of_line(g->serial, arg);
        else if (!strcmp(key, "board_part")) rest_of_line(g->board_part, arg);
        else if (!strcmp(key, "vbios")) rest_of_line(g->vbios, arg);
        else if (!strcmp(key, "bus_id")) rest_of_line(g->bus_id, arg);
        else if (!strcmp(key, "pci_device_id")) g->pci_device_id = strtoul(arg, NULL, 16);
        else if (!strcmp(key, "pci_subsystem_id")) g->pci_subsystem_id = strtoul(arg, NULL, 16);
        else if (!strcmp(key, "memory_total")) g->memory_total = strtoull(arg, NULL, 10);
        else if (!strcmp(key, "cc")) g->has_cc = sscanf(arg, "%d %d", &g->cc_major, &g->cc_minor) == 2;
        else if (!strcmp(key, "arch")) g->has_arch = sscanf(arg, "%u", &g->arch) == 1;
        else if (!strcmp(key, "ecc")) g->has_ecc = sscanf(arg, "%d %d", &g->ecc_current, &g->ecc_pending) == 2;
        else if (!strcmp(key, "ecc_errors"))
            g->has_ecc_errors = sscanf(arg, "%llu %llu %llu %llu", &g->ecc_errors[0], &g->ecc_errors[1],
                                       &g->ecc_errors[2], &g->ecc_errors[3]) == 4;
        else if (!strcmp(key, "remapped"))
            g->has_remapped = sscanf(arg, "%u %u %u %u", &g->remapped[0], &g->remapped[1], &g->remapped[2],
                                     &g->remapped[3]) == 4;
        else if (!strcmp(key, "retired")) g->has_retired = sscanf(arg, "%u %u", &g->retired[0], &g->retired[1]) == 2;
        else if (!strcmp(key, "power"))
            g->has_power = sscanf(arg, "%u %u %u %u", &g->power[0], &g->power[1], &g->power[2], &g->power[3]) == 4;
        else if (!strcmp(key, "clocks")) g->has_clocks = sscanf(arg, "%u %u", &g->clocks[0], &g->clocks[1]) == 2;
        else if (!strcmp(key, "pcie"))
            g->has_pcie = sscanf(arg, "%u %u %u %u", &g->pcie[0], &g->pcie[1], &g->pcie[2], &g->pcie[3]) == 4;
        else if (!strcmp(key, "persistence")) g->has_persistence = sscanf(arg, "%d", &g->persistence) == 1;
        else if (!strcmp(key, "mig")) g->has_mig = sscanf(arg, "%u %u", &g->mig[0], &g->mig[1]) == 2;
        else if (!strcmp(key, "temp")) g->has_temp = sscanf(arg, "%u", &g->temp) == 1;
        else if (!strcmp(key, "pcie_replay")) g->has_replay = sscanf(arg, "%u", &g->replay) == 1;
        else if (!strcmp(key, "recovery")) g->has_recovery = sscanf(arg, "%u", &g->recovery) == 1;
        else if (!strcmp(key, "drained")) g->has_drain = sscanf(arg, "%d", &g->drained) == 1;
        else if (!strcmp(key, "numa")) g->has_numa = sscanf(arg, "%u", &g->numa) == 1;
        else if (!strcmp(key, "affinity")) parse_affinity(g, arg);
        else if (!strcmp(key, "fabric"))
            g->has_fabric = sscanf(arg, "%u %u", &g->fabric_state, &g->fabric_status) == 2;
        else if (!strcmp(key, "load"))
            g->has_load = sscanf(arg, "%u %u %u %u %u %llx", &g->power_mw, &g->sm_mhz, &g->mem_mhz, &g->util_gpu,
                                 &g->util_mem, &g->throttle) == 6;
        else if (!strcmp(key, "nvlink")) {
            unsigned int link, version;
            int active, type;
            char remote[TEXT];
            if (sscanf(arg, "%u %d %u %95s %d", &link, &active, &version, remote, &type) == 5 && link < MAX_LINKS) {
                struct link *l = &g->links[link];
                l->present = 1, l->active = active, l->version = version, l->remote_type = type;
                snprintf(l->remote, TEXT, "%s", strcmp(remote, "-") ? remote : "");
            }
        } else if (!strcmp(key, "nvlink_errors")) {
            unsigned int link;
            unsigned long long e[4];
            if (sscanf(arg, "%u %llu %llu %llu %llu", &link, &e[0], &e[1], &e[2], &e[3]) == 5 && link < MAX_LINKS) {
                g->links[link].has_errors = 1;
                memcpy(g->links[link].errors, e, sizeof e);
            }
        }
    }
    fclose(f);
    return init_error;
}

#define DEV struct gpu *
#define CHECK_DEV(d) do { if (!initialized) return UNINITIALIZED; if (!(d)) return INVALID_ARGUMENT; } while (0)

static nvmlReturn_t copy_text(char *dst, unsigned int len, const char *src) {
    if (!src[0]) return NOT_SUPPORTED;
    if (strlen(src) + 1 > len) return INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return OK;
}

nvmlReturn_t nvmlInit_v2(void) {
    nvmlReturn_t rc = load();
    initialized = rc == OK;
    return rc;
}
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return OK; }
const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case OK: return "Success";
    case NOT_SUPPORTED: return "Not Supported";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { return initialized ? copy_text(v, len, driver) : UNINITIALIZED; }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) { return initialized ? copy_text(v, len, nvml_version) : UNINITIALIZED; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    if (!initialized) return UNINITIALIZED;
    if (cuda_version < 0) return NOT_SUPPORTED;
    *v = cuda_version;
    return OK;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return nvmlSystemGetCudaDriverVersion_v2(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { if (!initialized) return UNINITIALIZED; *n = gpu_count; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, DEV *d) {
    if (!initialized) return UNINITIALIZED;
    if (i >= gpu_count) return INVALID_ARGUMENT;
    *d = &gpus[i];
    return OK;
}
nvmlReturn_t nvmlDeviceGetIndex(DEV d, unsigned int *i) { CHECK_DEV(d); *i = d->index; return OK; }
nvmlReturn_t nvmlDeviceGetName(DEV d, char *v, unsigned int len) { CHECK_DEV(d); return copy_text(v, len, d->name); }
nvmlReturn_t nvmlDeviceGetUUID(DEV d, char *v, unsigned int len) { CHECK_DEV(d); return copy_text(v, len, d->uuid); }
nvmlReturn_t nvmlDeviceGetSerial(DEV d, char *v, unsigned int len) { CHECK_DEV(d); return copy_text(v, len, d->serial); }
nvmlReturn_t nvmlDeviceGetBoardPartNumber(DEV d, char *v, unsigned int len) { CHECK_DEV(d); return copy_text(v, len, d->board_part); }
nvmlReturn_t nvmlDeviceGetVbiosVersion(DEV d, char *v, unsigned int len) { CHECK_DEV(d); return copy_text(v, len, d->vbios); }

static nvmlReturn_t fill_pci(const char *bus_id, unsigned int dev_id, unsigned int sub_id, nvmlPciInfo_t *p) {
    unsigned int domain, bus, device, function;
    if (!bus_id[0] || sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) return NOT_SUPPORTED;
    memset(p, 0, sizeof *p);
    p->domain = domain, p->bus = bus, p->device = device;
    p->pciDeviceId = dev_id, p->pciSubSystemId = sub_id;
    snprintf(p->busId, sizeof p->busId, "%s", bus_id);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04x:%02x:%02x.%x", domain & 0xffff, bus, device, function);
    return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(DEV d, nvmlPciInfo_t *p) { CHECK_DEV(d); return fill_pci(d->bus_id, d->pci_device_id, d->pci_subsystem_id, p); }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(DEV d, nvmlMemory_v2_t *m) {
    CHECK_DEV(d);
    /* NVML_STRUCT_VERSION(Memory, 2): the caller must say which layout it passes. */
    if (m->version != (sizeof(nvmlMemory_v2_t) | (2u << 24))) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    if (!d->memory_total) return NOT_SUPPORTED;
    m->total = d->memory_total, m->reserved = 0, m->used = 0, m->free = d->memory_total;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(DEV d, int *major, int *minor) {
    CHECK_DEV(d);
    if (!d->has_cc) return NOT_SUPPORTED;
    *major = d->cc_major, *minor = d->cc_minor;
    return OK;
}
nvmlReturn_t nvmlDeviceGetArchitecture(DEV d, unsigned int *a) { CHECK_DEV(d); if (!d->has_arch) return NOT_SUPPORTED; *a = d->arch; return OK; }
nvmlReturn_t nvmlDeviceGetEccMode(DEV d, int *current, int *pending) {
    CHECK_DEV(d);
    if (!d->has_ecc) return NOT_SUPPORTED;
    *current = d->ecc_current, *pending = d->ecc_pending;
    return OK;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(DEV d, int type, int counter, unsigned long long *n) {
    CHECK_DEV(d);
    if (!d->has_ecc_errors || type < 0 || type > 1 || counter < 0 || counter > 1) return NOT_SUPPORTED;
    /* errorType 0 corrected, 1 uncorrected; counterType 0 volatile, 1 aggregate */
    *n = d->ecc_errors[counter * 2 + type];
    return OK;
}
/* nvmlGpuFabricInfo_t: cluster UUID, status, clique id, state (an unsigned char). */
typedef struct {
    unsigned char cluster_uuid[16];
    int status;
    unsigned int clique_id;
    unsigned char state;
} fabric_info;
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(DEV d, fabric_info *info) {
    CHECK_DEV(d);
    if (!d->has_fabric) return NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->status = (int)d->fabric_status, info->state = (unsigned char)d->fabric_state;
    return OK;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(DEV d, unsigned int *c, unsigned int *u, unsigned int *p, unsigned int *f) {
    CHECK_DEV(d);
    if (!d->has_remapped) return NOT_SUPPORTED;
    *c = d->remapped[0], *u = d->remapped[1], *p = d->remapped[2], *f = d->remapped[3];
    return OK;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(DEV d, int cause, unsigned int *count, unsigned long long *addresses) {
    CHECK_DEV(d);
    if (!d->has_retired || cause < 0 || cause > 1) return NOT_SUPPORTED;
    unsigned int have = d->retired[cause];
    if (*count < have) { *count = have; return have ? INSUFFICIENT_SIZE : OK; }
    for (unsigned int i = 0; i < have; i++) addresses[i] = 0x1000ull * (i + 1);
    *count = have;
    return OK;
}
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(DEV d, int cause, unsigned int *count, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    nvmlReturn_t rc = nvmlDeviceGetRetiredPages(d, cause, count, addresses);
    if (rc == OK && timestamps)
        for (unsigned int i = 0; i < *count; i++) timestamps[i] = 1700000000ull;
    return rc;
}
static nvmlReturn_t power(DEV d, int which, unsigned int *v) {
    CHECK_DEV(d);
    if (!d->has_power) return NOT_SUPPORTED;
    *v = d->power[which];
    return OK;
}
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(DEV d, unsigned int *v) { return power(d, 0, v); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(DEV d, unsigned int *v) { return power(d, 1, v); }
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(DEV d, unsigned int *min, unsigned int *max) {
    nvmlReturn_t rc = power(d, 2, min);
    return rc == OK ? power(d, 3, max) : rc;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(DEV d, int type, unsigned int *v) {
    CHECK_DEV(d);
    if (!d->has_clocks) return NOT_SUPPORTED;
    if (type == 1 || type == 0) *v = d->clocks[0]; /* SM, graphics */
    else if (type == 2) *v = d->clocks[1];         /* memory */
    else return NOT_SUPPORTED;
    return OK;
}
static nvmlReturn_t pcie(DEV d, int which, unsigned int *v) {
    CHECK_DEV(d);
    if (!d->has_pcie) return NOT_SUPPORTED;
    *v = d->pcie[which];
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(DEV d, unsigned int *v) { return pcie(d, 0, v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(DEV d, unsigned int *v) { return pcie(d, 1, v); }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(DEV d, unsigned int *v) { return pcie(d, 2, v); }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(DEV d, unsigned int *v) { return pcie(d, 3, v); }
nvmlReturn_t nvmlDeviceGetPersistenceMode(DEV d, int *v) { CHECK_DEV(d); if (!d->has_persistence) return NOT_SUPPORTED; *v = d->persistence; return OK; }
nvmlReturn_t nvmlDeviceGetMigMode(DEV d, unsigned int *cur, unsigned int *pending) {
    CHECK_DEV(d);
    if (!d->has_mig) return NOT_SUPPORTED;
    *cur = d->mig[0], *pending = d->mig[1];
    return OK;
}
nvmlReturn_t nvmlDeviceGetTemperature(DEV d, int sensor, unsigned int *v) {
    CHECK_DEV(d);
    if (!d->has_temp || sensor != 0) return NOT_SUPPORTED;
    *v = d->temp;
    return OK;
}
nvmlReturn_t nvmlDeviceGetPcieReplayCounter(DEV d, unsigned int *v) {
    CHECK_DEV(d);
    if (!d->has_replay) return NOT_SUPPORTED;
    *v = d->replay;
    return OK;
}
/* nvmlFieldValue_t: only NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230) is served. */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType; /* nvmlValueType_t: 1 = unsigned int */
    nvmlReturn_t nvmlReturn;
    union { double dVal; int siVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; unsigned short usVal; } value;
} nvmlFieldValue_t;
nvmlReturn_t nvmlDeviceGetFieldValues(DEV d, int count, nvmlFieldValue_t *values) {
    CHECK_DEV(d);
    for (int i = 0; i < count; i++) {
        if (values[i].fieldId == 230 && d->has_recovery) {
            values[i].valueType = 1, values[i].nvmlReturn = OK, values[i].value.uiVal = d->recovery;
        } else {
            values[i].nvmlReturn = NOT_SUPPORTED;
        }
    }
    return OK;
}
nvmlReturn_t nvmlDeviceQueryDrainState(nvmlPciInfo_t *pci, int *state) {
    if (!initialized) return UNINITIALIZED;
    if (!pci || !state) return INVALID_ARGUMENT;
    for (unsigned int i = 0; i < gpu_count; i++) {
        if (!strcasecmp(gpus[i].bus_id, pci->busId)) {
            if (!gpus[i].has_drain) return NOT_SUPPORTED;
            *state = gpus[i].drained;
            return OK;
        }
    }
    return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetNumaNodeId(DEV d, unsigned int *v) { CHECK_DEV(d); if (!d->has_numa) return NOT_SUPPORTED; *v = d->numa; return OK; }
nvmlReturn_t nvmlDeviceGetCpuAffinity(DEV d, unsigned int size, unsigned long *set) {
    CHECK_DEV(d);
    if (!d->has_affinity) return NOT_SUPPORTED;
    for (unsigned int i = 0; i < size; i++) set[i] = i < 16 ? d->affinity[i] : 0;
    return OK;
}

static struct link *nvlink(DEV d, unsigned int link) {
    return link < MAX_LINKS && d->links[link].present ? &d->links[link] : NULL;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(DEV d, unsigned int link, int *active) {
    CHECK_DEV(d);
    struct link *l = nvlink(d, link);
    if (!l) return link < MAX_LINKS ? NOT_SUPPORTED : INVALID_ARGUMENT;
    *active = l->active;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkVersion(DEV d, unsigned int link, unsigned int *v) {
    CHECK_DEV(d);
    struct link *l = nvlink(d, link);
    if (!l) return NOT_SUPPORTED;
    *v = l->version;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(DEV d, unsigned int link, nvmlPciInfo_t *p) {
    CHECK_DEV(d);
    struct link *l = nvlink(d, link);
    if (!l || !l->active) return NOT_SUPPORTED;
    return fill_pci(l->remote, 0, 0, p);
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(DEV d, unsigned int link, int *type) {
    CHECK_DEV(d);
    struct link *l = nvlink(d, link);
    if (!l || !l->active) return NOT_SUPPORTED;
    *type = l->remote_type;
    return OK;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(DEV d, unsigned int link, int counter, unsigned long long *v) {
    CHECK_DEV(d);
    struct link *l = nvlink(d, link);
    if (!l || !l->has_errors || counter < 0 || counter > 3) return NOT_SUPPORTED;
    *v = l->errors[counter];
    return OK;
}

/* Live readings, for telemetry during benchmarks. */
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
nvmlReturn_t nvmlDeviceGetPowerUsage(DEV d, unsigned int *mw) { CHECK_DEV(d); if (!d->has_load) return NOT_SUPPORTED; *mw = d->power_mw; return OK; }
nvmlReturn_t nvmlDeviceGetClockInfo(DEV d, int type, unsigned int *v) {
    CHECK_DEV(d);
    if (!d->has_load) return NOT_SUPPORTED;
    if (type == 0 || type == 1) *v = d->sm_mhz;
    else if (type == 2) *v = d->mem_mhz;
    else return NOT_SUPPORTED;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(DEV d, nvmlUtilization_t *u) {
    CHECK_DEV(d);
    if (!d->has_load) return NOT_SUPPORTED;
    u->gpu = d->util_gpu, u->memory = d->util_mem;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(DEV d, unsigned long long *r) {
    CHECK_DEV(d);
    if (!d->has_load) return NOT_SUPPORTED;
    *r = d->throttle;
    return OK;
}
