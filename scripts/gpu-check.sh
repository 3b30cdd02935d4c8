#!/usr/bin/env bash
# The GPU check: what a GPU machine runs, in one call, in under 8 minutes, from the bundle that
# scripts/gpu-bundle.sh builds on any x86-64 machine (kiln and kiln-gpu, stripped):
#
#   scripts/gpu-check.sh target/gpu-check/bundle.tar.gz OUTDIR
#
# Steps, each under its own time limit and all within KILN_CHECK_BUDGET (480 s), each result a
# file in OUTDIR (eight files in all, the most a
# GPU machine's call returns):
#   nvidia-smi.txt   `nvidia-smi -q`, to compare kiln's inventory with
#   inventory.json   `kiln inventory --json` (real NVML)
#   devices.json     `kiln-gpu devices` (CUDA's view)
#   gemm.json        `kiln bench gpu gemm --json --sweep` (bf16, f16, f32, tf32, fp8; KILN_CHECK_N, 8192)
#   memory.json      `kiln bench gpu memory --json` (device copy, host<->device; KILN_CHECK_MIB, 1024)
#                    (`kiln bench gpu p2p --json`, where CUDA sees two devices or more, goes into
#                    summary.json as "p2p": a ninth file would not come back); likewise
#                    `kiln bench gpu train --json` and PyTorch's run of the same model ("train"),
#                    and kiln-gpu's one-rank NCCL run of it, every gradient summed in GPU memory
#                    ("train"."nccl1": tokens/s over the plain run's, the end loss's difference)
#   torch.json       scripts/torch_gpu_anchors.py: torch.matmul at the same shapes, timed the same
#                    way, and a device copy
#   summary.json     each step's exit status and seconds, kiln's GEMM over PyTorch's per type and
#                    kiln's device copy over PyTorch's
#   log.txt          everything the steps said on stderr, and the libraries kiln-gpu resolves
# The CUDA libraries come from the Python environment's NVIDIA wheels (PyTorch's), found through
# `python3` (KILN_CHECK_PYTHON to name another); where it has none that kiln-gpu needs (a box with
# only the driver, python3 and pip), from CUDA 13.0's pinned runtime wheels, fetched once into
# KILN_CHECK_CUDA (default ~/.cache/kiln/cuda-13.0-runtime) by deploy/cuda/cuda-root.sh --runtime
# (KILN_CUDA_WHEELS=FOLDER: wheels fetched beforehand, for a box with no network); the driver's
# libcuda.so.1 from the system. Without PyTorch every kiln step still runs, and PyTorch's anchors
# say "skipped: no torch" (no failure: they are the comparison, not the box).
# Exit 0 when every step succeeded, 1 when one did not (the files say which and why), 2 on bad use.
set -uo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 BUNDLE.tar.gz|BUNDLE_DIR OUTDIR" >&2
    exit 2
fi
bundle=$1
out=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${KILN_CHECK_PYTHON:-python3}
n=${KILN_CHECK_N:-8192}
mib=${KILN_CHECK_MIB:-1024}
# kiln-gpu's DEFAULT_SWEEP (MAMF-style shapes); KILN_CHECK_SWEEP for fewer.
sweep=${KILN_CHECK_SWEEP:-1024,2048,4096,6144,8192,10240,12288,16384,8192x8192x4096,8192x8192x16384,16384x8192x8192,8192x16384x8192}
mkdir -p "$out" || exit 2
log=$out/log.txt
: >"$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary=()
failed=0
# The whole check's time (KILN_CHECK_BUDGET seconds, default 480: a GPU machine's call allows
# 600): each step gets at most what is left, and a step with under 10 s left is not started.
budget=${KILN_CHECK_BUDGET:-480}
begun=$(date +%s)

# step NAME LIMIT_S FILE COMMAND...: runs COMMAND with stdout to FILE, stderr to the log; exit
# statuses in OK (space-separated, default "0") count as success, those in SKIPPED as skipped.
step() {
    local name=$1 limit=$2 file=$3
    shift 3
    local ok=${OK:-0} skipped=${SKIPPED:-} started rc status left
    left=$((budget - ($(date +%s) - begun)))
    if [ "$left" -lt 10 ]; then
        summary+=("{\"step\":\"$name\",\"status\":\"skipped\",\"why\":\"the check's $budget s were spent\"}")
        echo "== $name: skipped: the check's $budget s were spent" >>"$log"
        failed=1
        return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== $name: $*" >>"$log"
    started=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >"$file" 2>>"$log"
    rc=$?
    status=failed
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status=timed_out
    elif [[ " $ok " == *" $rc "* ]]; then
        status=ok
    elif [[ " $skipped " == *" $rc "* ]]; then
        status=skipped
    fi
    [ "$status" = ok ] || failed=1
    summary+=("{\"step\":\"$name\",\"status\":\"$status\",\"exit\":$rc,\"seconds\":$(echo "$(date +%s.%N) - $started" | awk '{printf "%.2f", $1 - $3}')}")
    echo "== $name: $status (exit $rc)" >>"$log"
}

skip() {
    summary+=("{\"step\":\"$1\",\"status\":\"skipped\",\"why\":\"$2\"}")
    echo "== $1: skipped: $2" >>"$log"
    failed=1
}

# A PyTorch anchor without PyTorch: skipped, and no failure of the check.
no_torch() {
    summary+=("{\"step\":\"$1\",\"status\":\"skipped\",\"why\":\"no torch\"}")
    echo "== $1: skipped: no torch" >>"$log"
}

{
    echo "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
    [ -f "$bundle" ] || [ -d "$bundle" ] || echo "no bundle at $bundle"
} >>"$log"

# The bundle.
if [ -d "$bundle" ]; then
    cp "$bundle"/kiln "$bundle"/kiln-gpu "$work"/ 2>>"$log"
else
    tar -xzf "$bundle" -C "$work" 2>>"$log"
fi
if [ ! -x "$work/kiln" ] || [ ! -x "$work/kiln-gpu" ]; then
    echo "the bundle holds no kiln and kiln-gpu" >>"$log"
    printf '{"error":"the bundle %s holds no kiln and kiln-gpu","steps":[]}\n' "$bundle" >"$out/summary.json"
    exit 1
fi
cat "$work/COMMIT" >>"$log" 2>/dev/null

# The CUDA libraries of the Python environment's NVIDIA wheels.
libs=$("$python" - 2>>"$log" <<'PY'
import glob, os, sys
dirs = set()
for base in sys.path:
    for pattern in ("nvidia/*/lib", "nvidia/*/*/lib", "torch/lib"):
        for d in glob.glob(os.path.join(base, pattern)):
            if glob.glob(os.path.join(d, "lib*.so*")):
                dirs.add(d)
print(":".join(sorted(dirs)))
PY
)
if [ -n "$libs" ]; then
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# What kiln-gpu links and nothing here provides (the driver's libcuda.so.1 aside): the runtime wheels.
missing=$(ldd "$work/kiln-gpu" 2>/dev/null | awk '/not found/ && $1 != "libcuda.so.1" {print $1}' | paste -sd' ')
if [ -n "$missing" ]; then
    cache=${KILN_CHECK_CUDA:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/cuda-13.0-runtime}
    echo "kiln-gpu needs $missing, which nothing here provides: CUDA 13.0's runtime wheels into $cache" >>"$log"
    if runtime=$("$here/../deploy/cuda/cuda-root.sh" --runtime "$cache" 2>>"$log"); then
        export LD_LIBRARY_PATH="$runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        echo "the runtime wheels could not be fetched: kiln-gpu's steps will say what is missing" >>"$log"
    fi
fi
# PyTorch, for the anchors.
if "$python" -c 'import torch' 2>>"$log"; then
    torch=yes
else
    torch=
    echo "no torch in $python: PyTorch's anchors are skipped" >>"$log"
fi
{
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "kiln-gpu's libraries:"
    ldd "$work/kiln-gpu" 2>&1 | grep -E "cuda|cublas|curand|nccl|nvrtc|not found" || true
} >>"$log"

if command -v nvidia-smi >/dev/null; then
    step nvidia-smi 60 "$out/nvidia-smi.txt" nvidia-smi -q
else
    skip nvidia-smi "nvidia-smi is not installed"
    : >"$out/nvidia-smi.txt"
fi
step inventory 60 "$out/inventory.json" "$work/kiln" inventory --json
step devices 60 "$out/devices.json" "$work/kiln-gpu" devices
# 0 measured and passed, 1 measured and failed a check: both are results; 3 is skipped.
OK="0 1" SKIPPED=3 step gemm 300 "$out/gemm.json" env KILN_GPU="$work/kiln-gpu" KILN_DB="$work/kiln.db" \
    "$work/kiln" bench gpu gemm --json --dtypes bf16,f16,f32,tf32,fp8 --n "$n" --reps 20 --sweep "$sweep"
OK="0 1" SKIPPED=3 step memory 240 "$out/memory.json" env KILN_GPU="$work/kiln-gpu" KILN_DB="$work/kiln.db" \
    "$work/kiln" bench gpu memory --json --mib "$mib" --reps 20
# Peer to peer needs two GPUs; one is no failure of the box, so it is skipped without failing.
gpus=$("$python" -c 'import json, sys; print(len(json.load(open(sys.argv[1])).get("devices", [])))' \
    "$out/devices.json" 2>>"$log" || echo 0)
if [ "${gpus:-0}" -ge 2 ]; then
    OK="0 1" SKIPPED=3 step p2p 240 "$work/p2p.json" env KILN_GPU="$work/kiln-gpu" KILN_DB="$work/kiln.db" \
        "$work/kiln" bench gpu p2p --json --mib 256 --reps 20
else
    summary+=("{\"step\":\"p2p\",\"status\":\"skipped\",\"why\":\"CUDA sees ${gpus:-0} device(s); peer to peer needs two\"}")
    echo "== p2p: skipped: CUDA sees ${gpus:-0} device(s)" >>"$log"
fi
if [ -n "$torch" ]; then
    step torch 180 "$out/torch.json" "$python" "$here/torch_gpu_anchors.py" --n "$n" --reps 20 --copy-mib "$mib" \
        --sweep "$sweep"
else
    no_torch torch
    printf '{"skipped":"no torch: PyTorch is not installed for %s"}\n' "$python" >"$out/torch.json"
fi
# Training (KILN_CHECK_TRAIN: a size, default gpt2, or none; KILN_CHECK_TRAIN_STEPS, default 20):
# kiln on GPU 0 (bf16 products, f32 parameters), then PyTorch's eager run of the same model's
# shapes on the same GPU under bf16 autocast (benches/anchors/torch_train.py); both go into
# summary.json.
train=${KILN_CHECK_TRAIN:-gpt2}
train_steps=${KILN_CHECK_TRAIN_STEPS:-20}
if [ "$train" != none ]; then
    OK="0 1" SKIPPED=3 step train 240 "$work/train.json" env KILN_GPU="$work/kiln-gpu" KILN_DB="$work/kiln.db" \
        "$work/kiln" bench gpu train --json --gpus 0 --size "$train" --steps "$train_steps"
    dims=$("$python" -c 'import json, sys
c = json.load(open(sys.argv[1]))["report"]["results"][0]["run"]["run"]["config"]
print(c["vocab"], c["d_model"], c["layers"], c["heads"], c["seq"], c["batch"])' "$work/train.json" 2>>"$log")
    if [ -z "$torch" ]; then
        no_torch torch-train
    elif [ -n "$dims" ]; then
        # shellcheck disable=SC2086 # the six sizes, as separate arguments
        step torch-train 240 "$work/torch-train.txt" "$python" "$here/../benches/anchors/torch_train.py" \
            "$train_steps" eager $dims cuda:0 bf16
    else
        summary+=("{\"step\":\"torch-train\",\"status\":\"skipped\",\"why\":\"kiln's training left no model shapes\"}")
    fi
fi

# Data parallelism's device path on one GPU: a one-rank NCCL job (`kiln-gpu nccl-id --root`, then
# `kiln-gpu train … --nccl-id ID --rank 0 --ranks 1 --nccl-root`) sums every gradient in GPU memory
# each step (NCCL alone, the mean and the views of one flat tensor), so its loss curve must follow
# the plain run's and its tokens/s say what that path costs; both go into summary.json. The root is
# a loopback port free now, where the training process hosts NCCL's bootstrap (the id names it,
# so it outlives `nccl-id`).
if [ "$train" != none ]; then
    root=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print("127.0.0.1:%d" % s.getsockname()[1])' \
        2>>"$log")
    step nccl-id 60 "$work/nccl-id.json" "$work/kiln-gpu" nccl-id --root "$root"
    id=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["nccl_id"])' "$work/nccl-id.json" \
        2>>"$log")
    if [ -n "$id" ]; then
        step train-nccl 240 "$work/train-nccl.json" "$work/kiln-gpu" train --device 0 --size "$train" \
            --steps "$train_steps" --nccl-id "$id" --rank 0 --ranks 1 --nccl-root "$root"
    else
        skip train-nccl "kiln-gpu made no NCCL id"
    fi
fi

# kiln's GEMM over PyTorch's per type, and its device copy over PyTorch's (medians, one GPU alone).
ratios=$("$python" - "$out/gemm.json" "$out/memory.json" "$out/torch.json" 2>>"$log" <<'PY'
import json, sys
def load(path, *keys):
    try:
        doc = json.load(open(path))
        for k in keys:
            doc = doc[k]
        return doc
    except Exception:
        return None
gemm, memory = load(sys.argv[1], "report", "results"), load(sys.argv[2], "report", "results")
sweeps, torch_sweep = load(sys.argv[1], "report", "sweeps"), load(sys.argv[3], "sweep")
torch_gemm, torch_copy, torch_triad = load(sys.argv[3], "gemm"), load(sys.argv[3], "copy"), load(sys.argv[3], "triad")
out = []
by_type = {g["dtype"]: g for g in torch_gemm or []}
for r in gemm or []:
    if r["together"] or r.get("run") is None or r["dtype"] not in by_type:
        continue
    k, t = r["run"]["tflops_median"], by_type[r["dtype"]]["tflops_median"]
    out.append({"gpu": r["gpu"], "what": "gemm " + r["dtype"], "kiln": k, "torch": t, "unit": "TFLOP/s", "ratio": k / t})
for r in memory or []:
    if r["together"] or r.get("run") is None or torch_copy is None or r["placement"] == "remote":
        continue
    k, t = r["run"]["device_copy"]["gbps_median"], torch_copy["gbps_median"]
    out.append({"gpu": r["gpu"], "what": "device copy", "kiln": k, "torch": t, "unit": "GB/s", "ratio": k / t})
    if r["run"].get("triad") and torch_triad:
        k, t = r["run"]["triad"]["gbps_median"], torch_triad["gbps_median"]
        out.append({"gpu": r["gpu"], "what": "triad", "kiln": k, "torch": t, "unit": "GB/s", "ratio": k / t})
if sweeps and torch_sweep:
    theirs = max(t["tflops_median"] for t in torch_sweep)
    for sw in sweeps:
        if sw.get("best_tflops") and sw["dtype"] == torch_sweep[0]["dtype"]:
            out.append({"gpu": sw["gpu"], "what": "gemm best shape " + sw["dtype"], "kiln": sw["best_tflops"],
                        "torch": theirs, "unit": "TFLOP/s", "ratio": sw["best_tflops"] / theirs})
print(json.dumps(out))
PY
)
steps=$(IFS=,; echo "${summary[*]}")
p2p=$("$python" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$work/p2p.json" 2>/dev/null)
# kiln's training run (tokens/s, MFU, learned) beside PyTorch's RESULT line, and their ratio.
trained=$("$python" - "$work/train.json" "$work/torch-train.txt" "$work/train-nccl.json" 2>>"$log" <<'PY'
import json, re, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception:
    print("null"); sys.exit()
out = {"status": doc.get("status"), "skipped": doc.get("skipped"), "failures": doc.get("report", {}).get("failures")}
for r in doc.get("report", {}).get("results", []):
    if r.get("run"):
        run = r["run"]["run"]
        out.update(gpu=r["gpu"], size=run["config"]["size"], tokens_per_s=run["tokens_per_s"], mfu=run["mfu"],
                   step_cv=run["step_s"]["cv"], learned=run["learned"], loss=[run["loss_start"], run["loss_end"]])
try:
    m = re.search(r"tokens_per_s_median=(\d+)", open(sys.argv[2]).read())
    if m and "tokens_per_s" in out:
        out["torch_tokens_per_s"] = int(m.group(1))
        out["kiln_over_torch"] = out["tokens_per_s"] / int(m.group(1))
except OSError:
    pass
# The one-rank NCCL run: its tokens/s over the plain run's, and how far its loss ended from it.
try:
    nccl = json.load(open(sys.argv[3]))["run"]
    out["nccl1"] = {"tokens_per_s": nccl["tokens_per_s"], "learned": nccl["learned"],
                    "comm_share": (nccl.get("parallel") or {}).get("comm_share"),
                    "loss": [nccl["loss_start"], nccl["loss_end"]]}
    if "tokens_per_s" in out:
        out["nccl1"]["over_plain"] = nccl["tokens_per_s"] / out["tokens_per_s"]
        out["nccl1"]["loss_end_diff"] = nccl["loss_end"] - out["loss"][1]
except (OSError, ValueError, KeyError, TypeError):
    pass
print(json.dumps(out))
PY
)
printf '{"bundle":"%s","n":%s,"steps":[%s],"kiln_over_torch":%s,"p2p":%s,"train":%s}\n' \
    "$(cat "$work/COMMIT" 2>/dev/null || echo unknown)" "$n" "$steps" "${ratios:-[]}" "${p2p:-null}" \
    "${trained:-null}" >"$out/summary.json"
exit "$failed"
