/* The STREAM triad in C with OpenMP, the anchor kiln's membw is compared with in one run
 * (benches/membw.rs). Written for kiln (not McCalpin's stream.c, whose licence asks that derived
 * results be labelled); same kernel, same byte counting (24 bytes per element), best and median of
 * the repetitions after two warm-ups. Usage: triad <elements per array> <repetitions> */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 32L << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    double *gbps = malloc(reps * sizeof *gbps);
    if (!a || !b || !c || !gbps) return 1;
#pragma omp parallel for schedule(static)
    for (long j = 0; j < n; j++) a[j] = 1.0, b[j] = 2.0, c[j] = 0.5;
    for (int k = -2; k < reps; k++) {
        double s = 3.0 + k, t = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long j = 0; j < n; j++) a[j] = b[j] + s * c[j];
        t = omp_get_wtime() - t;
        if (k >= 0) gbps[k] = 24.0 * n / t / 1e9;
    }
    qsort(gbps, reps, sizeof *gbps, cmp);
    printf("%.3f %.3f %f\n", gbps[reps / 2], gbps[reps - 1], a[n / 2]);
    return 0;
}
