/*
 * 8-byte AllReduce latency through the C ABI on a GPU: N processes (this
 * one is rank 0, the others are forked before anything is set up), each with
 * device buffers and its own stream, calling ncclAllReduce and
 * synchronising the stream after every call.
 *
 *   latency NPROCS [ITERS]
 *
 * The CUDA driver is loaded at run time (dlopen of libcuda.so.1), so this
 * builds without the CUDA toolkit. Prints one line per rank count from
 * rank 0: median and mean microseconds per call.
 */
#include <nccl.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*cuInit_t)(unsigned);
typedef int (*cuDeviceGet_t)(int *, int);
typedef int (*cuCtxRetain_t)(void **, int);
typedef int (*cuCtxSet_t)(void *);
typedef int (*cuMemAlloc_t)(unsigned long long *, size_t);
typedef int (*cuStreamCreate_t)(void **, unsigned);
typedef int (*cuStreamSync_t)(void *);

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int no_sync(void *s) { (void)s; return 0; }

static int rank_main(int rank, int n, ncclUniqueId id, int iters) {
  void *stream = NULL;
  unsigned long long buf;
  cuStreamSync_t ssync = no_sync;
  const char *be = getenv("OXCCL_BACKEND");
  if (be && !strcmp(be, "host")) {
    /* The host backend: host buffers, no stream (a check of this program). */
    buf = (unsigned long long)(size_t)calloc(16, 4);
  } else {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) { fprintf(stderr, "rank %d: no libcuda.so.1\n", rank); return 2; }
  cuInit_t cuInit = (cuInit_t)dlsym(cu, "cuInit");
  cuDeviceGet_t cuDeviceGet = (cuDeviceGet_t)dlsym(cu, "cuDeviceGet");
  cuCtxRetain_t retain = (cuCtxRetain_t)dlsym(cu, "cuDevicePrimaryCtxRetain");
  cuCtxSet_t set = (cuCtxSet_t)dlsym(cu, "cuCtxSetCurrent");
  cuMemAlloc_t alloc = (cuMemAlloc_t)dlsym(cu, "cuMemAlloc_v2");
  cuStreamCreate_t screate = (cuStreamCreate_t)dlsym(cu, "cuStreamCreate");
  ssync = (cuStreamSync_t)dlsym(cu, "cuStreamSynchronize");
  int dev;
  void *ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || retain(&ctx, dev) || set(ctx) || alloc(&buf, 64) ||
      screate(&stream, 1)) {
    fprintf(stderr, "rank %d: CUDA set-up failed\n", rank);
    return 2;
  }
  }
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, n, id, rank);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: init %d %s\n", rank, (int)r, ncclGetLastError(NULL));
    return 3;
  }
  double *t = malloc(sizeof(double) * iters);
  for (int i = -20; i < iters; i++) {
    double t0 = now_us();
    r = ncclAllReduce((void *)buf, (void *)buf, 2, ncclFloat32, ncclSum, comm, (cudaStream_t)stream);
    if (r != ncclSuccess || ssync(stream)) {
      fprintf(stderr, "rank %d: allreduce %d %s\n", rank, (int)r, ncclGetLastError(comm));
      return 4;
    }
    if (i >= 0) t[i] = now_us() - t0;
  }
  double sum = 0;
  for (int i = 0; i < iters; i++) sum += t[i];
  qsort(t, iters, sizeof(double), cmp);
  if (rank == 0)
    printf("c-abi allreduce 8 B, %d procs: median %.1f us, mean %.1f us per call (call + stream sync, %d calls)\n",
           n, t[iters / 2], sum / iters, iters);
  ncclCommDestroy(comm);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s NPROCS [ITERS]\n", argv[0]); return 100; }
  int n = atoi(argv[1]), iters = argc > 2 ? atoi(argv[2]) : 500;
  /* Children are forked before the library or CUDA is used; the id
   * reaches them through a pipe. */
  int fds[2];
  if (pipe(fds)) return 1;
  for (int r = 1; r < n; r++)
    if (fork() == 0) {
      ncclUniqueId id;
      close(fds[1]);
      if (read(fds[0], &id, sizeof id) != (ssize_t)sizeof id) _exit(6);
      _exit(rank_main(r, n, id, iters));
    }
  close(fds[0]);
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) { fprintf(stderr, "no id: %s\n", ncclGetLastError(NULL)); return 1; }
  for (int r = 1; r < n; r++)
    if (write(fds[1], &id, sizeof id) != (ssize_t)sizeof id) return 1;
  int rc = rank_main(0, n, id, iters);
  for (int r = 1; r < n; r++) {
    int st;
    wait(&st);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = rc ? rc : 5;
  }
  return rc;
}
