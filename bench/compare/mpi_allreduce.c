/* MPI_Allreduce timed the way `tpar bench` times a CPU all-reduce, so the two columns of
 * bench/compare/vs-mpi.sh compare like with like: per size, `warmup` untimed calls, one
 * barrier, then `iters` back-to-back calls each timed on every rank; per iteration the
 * slowest rank counts; the median and the 10th/90th percentiles of those are printed.
 * Inputs are random floats (never zeros), the output is poisoned before every size, and the
 * result is checked against the rank-order sum within float rounding.
 *
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 * Run:   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_allreduce -b 8 -e 8M -f 4 -n 50 -w 10
 * Output: one line per size: "bytes count median_us p10_us p90_us wrong".
 * A comparison tool, not part of tpar. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static long parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (long)v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, int n, double p) {
    int i = (int)(p * (n - 1) + 0.5);
    return sorted[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

/* A deterministic value per (rank, index): every rank can compute every rank's input. */
static float input_value(int rank, long i) {
    unsigned long x = (unsigned long)(rank + 1) * 0x9e3779b97f4a7c15ul ^ (unsigned long)i * 0xbf58476d1ce4e5b9ul;
    x ^= x >> 31; x *= 0x94d049bb133111ebul; x ^= x >> 29;
    return (float)((double)(x >> 40) / (double)(1ul << 24)) * 2.0f - 1.0f + 1e-3f;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    long minb = 8, maxb = 8 << 20;
    double factor = 4;
    int iters = 50, warmup = 10;
    for (int a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "-b")) minb = parse_size(argv[a + 1]);
        else if (!strcmp(argv[a], "-e")) maxb = parse_size(argv[a + 1]);
        else if (!strcmp(argv[a], "-f")) factor = atof(argv[a + 1]);
        else if (!strcmp(argv[a], "-n")) iters = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "-w")) warmup = atoi(argv[a + 1]);
    }
    if (factor < 2) factor = 2;
    long maxcount = maxb / 4 > 0 ? maxb / 4 : 1;
    float *in = malloc(maxcount * sizeof(float));
    float *out = malloc(maxcount * sizeof(float));
    double *times = malloc(iters * sizeof(double));
    double *worst = malloc(iters * sizeof(double));
    for (long i = 0; i < maxcount; i++) in[i] = input_value(rank, i);
    if (rank == 0) printf("# MPI_Allreduce float sum, %d ranks; bytes count median_us p10_us p90_us wrong\n", world);
    for (long bytes = minb; bytes <= maxb; bytes = (long)(bytes * factor)) {
        long count = bytes / 4 > 0 ? bytes / 4 : 1;
        memset(out, 0xff, count * sizeof(float));
        for (int w = 0; w < warmup; w++) MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long wrong = 0;
        for (long i = 0; i < count; i++) {
            float want = 0.0f;
            for (int r = 0; r < world; r++) want += input_value(r, i);
            if (!(fabsf(out[i] - want) <= 1e-5f * world)) wrong++;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        for (int it = 0; it < iters; it++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            times[it] = (MPI_Wtime() - t0) * 1e6;
        }
        MPI_Reduce(times, worst, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long wrong_all = 0;
        MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            qsort(worst, iters, sizeof(double), cmp_double);
            printf("%ld %ld %.3f %.3f %.3f %ld\n", bytes, count, pct(worst, iters, 0.5), pct(worst, iters, 0.1),
                   pct(worst, iters, 0.9), wrong_all);
            fflush(stdout);
        }
    }
    free(in); free(out); free(times); free(worst);
    MPI_Finalize();
    return 0;
}
