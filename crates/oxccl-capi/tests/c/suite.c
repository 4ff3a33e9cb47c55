/*
 * The C suite: a program written against include/nccl.h, linked with
 * -lnccl (oxccl's libnccl.so.2), run as several processes by
 * tests/c_suite.rs on the host backend (OXCCL_BACKEND=host: buffers are
 * host memory, streams are ignored).
 *
 *   suite SCENARIO RANK NRANKS DIR
 *
 * Rank 0 makes the unique id and leaves it in DIR/id; the others read it.
 * Every check prints what failed; the exit status is the failure count.
 */
#include <nccl.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures = 0;
static int g_rank = 0, g_nranks = 1;

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", g_rank,          \
              __FILE__, __LINE__, #cond);                                    \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                 \
      failures++;                                                            \
    }                                                                        \
  } while (0)

#define NCCL_OK(call)                                                        \
  do {                                                                       \
    ncclResult_t r_ = (call);                                                \
    if (r_ != ncclSuccess) {                                                 \
      fprintf(stderr, "rank %d: %s:%d: %s returned %d (%s): %s\n", g_rank,   \
              __FILE__, __LINE__, #call, (int)r_, ncclGetErrorString(r_),    \
              ncclGetLastError(NULL));                                       \
      failures++;                                                            \
      return;                                                                \
    }                                                                        \
  } while (0)

/* `call` is refused with `code`, and ncclGetLastError's message names
 * `word`. */
#define BAD(call, code, word)                                                        \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    const char *m_ = ncclGetLastError(NULL);                                         \
    CHECK(r_ == (code), "%s returned %d, want %d (%s)", #call, (int)r_, (int)(code), m_); \
    CHECK(strstr(m_, (word)) != NULL, "%s: message '%s' lacks '%s'", #call, m_, (word)); \
  } while (0)

/* ---------- element encoding: exact small values in all 12 types ---------- */

static size_t type_size(int t) {
  static const size_t s[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return s[t];
}

static int is_float(int t) { return t >= ncclFloat16; }

/* A minifloat with `e` exponent bits, `m` mantissa bits and bias `b`, for
 * the non-negative values the suite uses (0 or normal, exact). */
static unsigned enc_mini(double v, int e, int m, int b) {
  (void)e;
  if (v == 0) return 0;
  int ex = (int)floor(log2(v));
  double frac = v / ldexp(1.0, ex) - 1.0;
  unsigned mant = (unsigned)llround(frac * (double)(1u << m));
  return ((unsigned)(ex + b) << m) | mant;
}

static double dec_mini(unsigned bits, int e, int m, int b) {
  unsigned ex = bits >> m & ((1u << e) - 1), mant = bits & ((1u << m) - 1);
  if (ex == 0 && mant == 0) return 0;
  return ldexp(1.0 + (double)mant / (double)(1u << m), (int)ex - b);
}

static void put(int t, void *buf, size_t i, double v) {
  char *p = (char *)buf + i * type_size(t);
  switch (t) {
  case ncclInt8: *(int8_t *)p = (int8_t)v; break;
  case ncclUint8: *(uint8_t *)p = (uint8_t)v; break;
  case ncclInt32: *(int32_t *)p = (int32_t)v; break;
  case ncclUint32: *(uint32_t *)p = (uint32_t)v; break;
  case ncclInt64: *(int64_t *)p = (int64_t)v; break;
  case ncclUint64: *(uint64_t *)p = (uint64_t)v; break;
  case ncclFloat16: *(uint16_t *)p = (uint16_t)enc_mini(v, 5, 10, 15); break;
  case ncclFloat32: *(float *)p = (float)v; break;
  case ncclFloat64: *(double *)p = v; break;
  case ncclBfloat16: *(uint16_t *)p = (uint16_t)enc_mini(v, 8, 7, 127); break;
  case ncclFloat8e4m3: *(uint8_t *)p = (uint8_t)enc_mini(v, 4, 3, 7); break;
  case ncclFloat8e5m2: *(uint8_t *)p = (uint8_t)enc_mini(v, 5, 2, 15); break;
  }
}

static double get(int t, const void *buf, size_t i) {
  const char *p = (const char *)buf + i * type_size(t);
  switch (t) {
  case ncclInt8: return *(const int8_t *)p;
  case ncclUint8: return *(const uint8_t *)p;
  case ncclInt32: return *(const int32_t *)p;
  case ncclUint32: return *(const uint32_t *)p;
  case ncclInt64: return (double)*(const int64_t *)p;
  case ncclUint64: return (double)*(const uint64_t *)p;
  case ncclFloat16: return dec_mini(*(const uint16_t *)p, 5, 10, 15);
  case ncclFloat32: return *(const float *)p;
  case ncclFloat64: return *(const double *)p;
  case ncclBfloat16: return dec_mini(*(const uint16_t *)p, 8, 7, 127);
  case ncclFloat8e4m3: return dec_mini(*(const uint8_t *)p, 4, 3, 7);
  case ncclFloat8e5m2: return dec_mini(*(const uint8_t *)p, 5, 2, 15);
  }
  return NAN;
}

/* Rank r's input element k: 1 or 2, so sums, products, averages and the
 * PreMulSum (x2) of up to 4 ranks are exact in every type, fp8 included. */
static double input(int r, size_t k) { return (double)((r + k) % 2 + 1); }

#define PREMUL_SCALAR 2.0
#define OP_PREMUL 100 /* the suite's own marker, never passed to NCCL */

static double reduce(int op, int t, size_t k, int n, int skip) {
  double acc = 0;
  int first = 1;
  for (int r = 0; r < n; r++) {
    if (r == skip) continue;
    double x = input(r, k);
    if (op == OP_PREMUL) x *= PREMUL_SCALAR;
    if (op == ncclAvg && is_float(t)) x /= n;
    if (first) { acc = x; first = 0; continue; }
    switch (op) {
    case ncclProd: acc *= x; break;
    case ncclMax: acc = x > acc ? x : acc; break;
    case ncclMin: acc = x < acc ? x : acc; break;
    default: acc += x; break;
    }
  }
  if (op == ncclAvg && !is_float(t)) acc = trunc(acc / n);
  return acc;
}

/* Mismatches between buf (len elements of t) and want(k). */
typedef double (*want_fn)(size_t k, void *ctx);
static int compare(const char *what, int t, const void *buf, size_t len, want_fn want, void *ctx, int quiet) {
  int bad = 0;
  for (size_t k = 0; k < len; k++) {
    double w = want(k, ctx), g = get(t, buf, k);
    if (g != w) {
      if (!quiet && bad < 3)
        fprintf(stderr, "rank %d: %s type %d: element %zu is %g, want %g\n", g_rank, what, t, k, g, w);
      bad++;
    }
  }
  return bad;
}

struct rctx { int op, t, n, skip; size_t off; };
static double want_reduce(size_t k, void *c) {
  struct rctx *x = c;
  return reduce(x->op, x->t, x->off + k, x->n, x->skip);
}
struct cctx { int root; size_t off; };
static double want_copy(size_t k, void *c) {
  struct cctx *x = c;
  return input(x->root, x->off + k);
}
struct gctx { size_t count; int me; int a2a; };
static double want_gather(size_t k, void *c) {
  struct gctx *x = c;
  int from = (int)(k / x->count);
  size_t i = k % x->count;
  return input(from, x->a2a ? (size_t)x->me * x->count + i : i);
}

/* ---------- set-up ---------- */

static char g_dir[4096];

static void id_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", g_dir, name); }

/* Writes `id` as DIR/name for the other processes. */
static int publish_id(const char *name, const ncclUniqueId *id) {
  char path[4200], tmp[4300];
  id_path(path, sizeof path, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f || fwrite(id, sizeof *id, 1, f) != 1) return -1;
  fclose(f);
  return rename(tmp, path);
}

/* Waits (at most 60 s) for DIR/name and reads it. */
static int wait_id(const char *name, ncclUniqueId *id) {
  char path[4200];
  id_path(path, sizeof path, name);
  for (int i = 0; i < 6000; i++) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return 0;
    }
    usleep(10000);
  }
  return -1;
}

/* Rank `maker` makes an id and publishes it as DIR/name; the others wait
 * for it (at most 60 s). */
static int share_id_by(const char *name, ncclUniqueId *id, int maker) {
  if (g_rank != maker) return wait_id(name, id);
  if (ncclGetUniqueId(id) != ncclSuccess) return -1;
  return publish_id(name, id);
}

static int share_id(const char *name, ncclUniqueId *id) { return share_id_by(name, id, 0); }

static ncclComm_t world(const char *name) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  if (share_id(name, &id) != 0) {
    fprintf(stderr, "rank %d: no unique id\n", g_rank);
    failures++;
    return NULL;
  }
  ncclResult_t r = ncclCommInitRank(&comm, g_nranks, id, g_rank);
  CHECK(r == ncclSuccess, "init: %d %s", (int)r, ncclGetLastError(NULL));
  return r == ncclSuccess ? comm : NULL;
}

/* ---------- scenarios ---------- */

static const int OPS[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, OP_PREMUL};

/* Every collective, type and op (and the in-place forms) on `comm`. */
static void run_colls(ncclComm_t comm) {
  const size_t c = 37;
  int n = g_nranks, me = g_rank;
  cudaStream_t s = NULL;
  for (int t = 0; t < ncclNumTypes; t++) {
    size_t es = type_size(t);
    char *in = malloc(c * n * es), *out = malloc(c * n * es);
    for (int oi = 0; oi < 6; oi++) {
      int op = OPS[oi];
      ncclRedOp_t nop = (ncclRedOp_t)op;
      if (op == OP_PREMUL) {
        double sc = PREMUL_SCALAR;
        char scalar[8];
        put(t, scalar, 0, sc);
        NCCL_OK(ncclRedOpCreatePreMulSum(&nop, scalar, (ncclDataType_t)t, ncclScalarHostImmediate, comm));
        CHECK(nop >= ncclNumOps, "premul handle %d", (int)nop);
      }
      struct rctx rc = {op, t, n, -1, 0};
      /* AllReduce, out of place then in place. */
      for (size_t k = 0; k < c; k++) put(t, in, k, input(me, k));
      memset(out, 0xee, c * es);
      NCCL_OK(ncclAllReduce(in, out, c, t, nop, comm, s));
      CHECK(compare("allreduce", t, out, c, want_reduce, &rc, 0) == 0, "op %d", op);
      NCCL_OK(ncclAllReduce(in, in, c, t, nop, comm, s));
      CHECK(compare("allreduce in place", t, in, c, want_reduce, &rc, 0) == 0, "op %d", op);
      /* Reduce to the last rank. */
      for (size_t k = 0; k < c; k++) put(t, in, k, input(me, k));
      memset(out, 0xee, c * es);
      NCCL_OK(ncclReduce(in, out, c, t, nop, n - 1, comm, s));
      if (me == n - 1) CHECK(compare("reduce", t, out, c, want_reduce, &rc, 0) == 0, "op %d", op);
      /* ReduceScatter: rank me gets block me. */
      for (size_t k = 0; k < c * n; k++) put(t, in, k, input(me, k));
      memset(out, 0xee, c * es);
      NCCL_OK(ncclReduceScatter(in, out, c, t, nop, comm, s));
      rc.off = (size_t)me * c;
      CHECK(compare("reducescatter", t, out, c, want_reduce, &rc, 0) == 0, "op %d", op);
      NCCL_OK(ncclReduceScatter(in, in + (size_t)me * c * es, c, t, nop, comm, s));
      CHECK(compare("reducescatter in place", t, in + (size_t)me * c * es, c, want_reduce, &rc, 0) == 0, "op %d", op);
      if (op == OP_PREMUL) NCCL_OK(ncclRedOpDestroy(nop, comm));
    }
    /* Broadcast from rank 1 % n, out of place and in place. */
    int root = 1 % n;
    struct cctx cc = {root, 0};
    for (size_t k = 0; k < c; k++) put(t, in, k, input(me, k));
    memset(out, 0xee, c * es);
    NCCL_OK(ncclBroadcast(in, out, c, t, root, comm, s));
    CHECK(compare("broadcast", t, out, c, want_copy, &cc, 0) == 0, "root %d", root);
    NCCL_OK(ncclBcast(in, c, t, root, comm, s));
    CHECK(compare("bcast", t, in, c, want_copy, &cc, 0) == 0, "root %d", root);
    /* AllGather, out of place and in place. */
    struct gctx gc = {c, me, 0};
    for (size_t k = 0; k < c; k++) put(t, in, k, input(me, k));
    memset(out, 0xee, c * n * es);
    NCCL_OK(ncclAllGather(in, out, c, t, comm, s));
    CHECK(compare("allgather", t, out, c * n, want_gather, &gc, 0) == 0, "%s", "mismatch");
    for (size_t k = 0; k < c; k++) put(t, out + (size_t)me * c * es, k, input(me, k));
    NCCL_OK(ncclAllGather(out + (size_t)me * c * es, out, c, t, comm, s));
    CHECK(compare("allgather in place", t, out, c * n, want_gather, &gc, 0) == 0, "%s", "mismatch");
    /* AlltoAll: block j of my input goes to rank j. */
    struct gctx ac = {c, me, 1};
    for (size_t k = 0; k < c * n; k++) put(t, in, k, input(me, k));
    memset(out, 0xee, c * n * es);
    NCCL_OK(ncclAlltoAll(in, out, c, t, comm, s));
    CHECK(compare("alltoall", t, out, c * n, want_gather, &ac, 0) == 0, "%s", "mismatch");
    /* Gather to rank 0, Scatter from rank 0. */
    for (size_t k = 0; k < c; k++) put(t, in, k, input(me, k));
    memset(out, 0xee, c * n * es);
    NCCL_OK(ncclGather(in, out, c, t, 0, comm, s));
    if (me == 0) CHECK(compare("gather", t, out, c * n, want_gather, &gc, 0) == 0, "%s", "mismatch");
    for (size_t k = 0; k < c * n; k++) put(t, in, k, input(me, k));
    memset(out, 0xee, c * es);
    NCCL_OK(ncclScatter(in, out, c, t, 0, comm, s));
    struct cctx sc = {0, (size_t)me * c};
    CHECK(compare("scatter", t, out, c, want_copy, &sc, 0) == 0, "%s", "mismatch");
    free(in);
    free(out);
  }
}

static void scenario_colls(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  int v = 0, cnt = 0, rk = -1;
  NCCL_OK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE && v == NCCL_VERSION(2, 30, 7), "version %d", v);
  NCCL_OK(ncclCommCount(comm, &cnt));
  NCCL_OK(ncclCommUserRank(comm, &rk));
  CHECK(cnt == g_nranks && rk == g_rank, "count %d rank %d", cnt, rk);
  run_colls(comm);
  /* A PreMulSum scalar read from memory at each call (ncclScalarDevice;
   * host memory on the host backend). */
  float scalar = 3.0f, buf[8], in8[8], want = 0;
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarDevice, comm));
  for (int r = 0; r < g_nranks; r++) want += 3.0f * (float)(r + 1);
  for (int i = 0; i < 8; i++) buf[i] = (float)(g_rank + 1);
  NCCL_OK(ncclAllReduce(buf, buf, 8, ncclFloat32, op, comm, NULL));
  CHECK(buf[0] == want && buf[7] == want, "premul device scalar: %g want %g", buf[0], want);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  /* Registering the caller's memory succeeds wherever NCCL's does, also
   * where peers cannot reach it (rank processes of the host backend): the
   * calls on it then take the unregistered path, right all the same. */
  void *hin = NULL, *hbuf = NULL;
  NCCL_OK(ncclCommRegister(comm, in8, sizeof in8, &hin));
  NCCL_OK(ncclCommRegister(comm, buf, sizeof buf, &hbuf));
  for (int i = 0; i < 8; i++) in8[i] = (float)(g_rank + 1);
  NCCL_OK(ncclAllReduce(in8, buf, 8, ncclFloat32, ncclSum, comm, NULL));
  float sum = (float)(g_nranks * (g_nranks + 1) / 2);
  CHECK(buf[0] == sum && buf[7] == sum, "allreduce on registered memory: %g want %g", buf[0], sum);
  NCCL_OK(ncclCommDeregister(comm, hbuf));
  NCCL_OK(ncclCommDeregister(comm, hin));
  BAD(ncclCommDeregister(comm, hin), ncclInvalidArgument, "not a registration");
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
}

/* The checker finds a doubled element, a zeroed one and a dropped rank. */
static void scenario_selftest(void) {
  const size_t c = 16;
  for (int t = 0; t < ncclNumTypes; t++) {
    char buf[16 * 8];
    struct rctx rc = {ncclSum, t, 4, -1, 0};
    for (size_t k = 0; k < c; k++) put(t, buf, k, reduce(ncclSum, t, k, 4, -1));
    CHECK(compare("exact", t, buf, c, want_reduce, &rc, 1) == 0, "exact result refused");
    put(t, buf, 3, 2 * get(t, buf, 3));
    CHECK(compare("doubled", t, buf, c, want_reduce, &rc, 1) == 1, "doubled element not seen");
    put(t, buf, 3, 0);
    CHECK(compare("zeroed", t, buf, c, want_reduce, &rc, 1) == 1, "zeroed element not seen");
    for (size_t k = 0; k < c; k++) put(t, buf, k, reduce(ncclSum, t, k, 4, 2));
    CHECK(compare("dropped", t, buf, c, want_reduce, &rc, 1) == (int)c, "dropped rank not seen");
  }
}

/* Groups: a Send/Recv ring, nested groups, a collective in the group. */
static void scenario_groups(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  int n = g_nranks, me = g_rank;
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  int64_t out[64], in[64], sum[64];
  for (int i = 0; i < 64; i++) { out[i] = me * 1000 + i; sum[i] = me; }
  memset(in, 0, sizeof in);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(out, 64, ncclInt64, next, comm, NULL));
  NCCL_OK(ncclRecv(in, 64, ncclInt64, prev, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclAllReduce(sum, sum, 64, ncclInt64, ncclSum, comm, NULL));
  /* Nothing ran before the outermost end. */
  CHECK(in[5] == 0 && sum[5] == me, "group ran early: in %lld sum %lld", (long long)in[5], (long long)sum[5]);
  NCCL_OK(ncclGroupEnd());
  CHECK(in[5] == prev * 1000 + 5, "ring: got %lld want %d", (long long)in[5], prev * 1000 + 5);
  CHECK(sum[63] == (int64_t)n * (n - 1) / 2, "group allreduce: %lld", (long long)sum[63]);
  /* Send/Recv with both peers (a full exchange) in one group. */
  int32_t a[4 * 8], b[4 * 8];
  for (int p = 0; p < n; p++)
    for (int i = 0; i < 8; i++) a[p * 8 + i] = me * 100 + p;
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < n; p++) {
    NCCL_OK(ncclSend(a + p * 8, 8, ncclInt32, p, comm, NULL));
    NCCL_OK(ncclRecv(b + p * 8, 8, ncclInt32, p, comm, NULL));
  }
  NCCL_OK(ncclGroupEnd());
  for (int p = 0; p < n; p++) CHECK(b[p * 8 + 7] == p * 100 + me, "exchange from %d: %d", p, b[p * 8 + 7]);
  /* Several communicators driven from this one thread: two ranks of one
   * in-process clique (ncclCommInitAll), in one group. */
  ncclComm_t two[2];
  NCCL_OK(ncclCommInitAll(two, 2, NULL));
  float x[2][16];
  for (int i = 0; i < 16; i++) { x[0][i] = 1; x[1][i] = 2; }
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(x[0], x[0], 16, ncclFloat32, ncclSum, two[0], NULL));
  NCCL_OK(ncclAllReduce(x[1], x[1], 16, ncclFloat32, ncclSum, two[1], NULL));
  NCCL_OK(ncclGroupEnd());
  CHECK(x[0][15] == 3 && x[1][0] == 3, "initall group: %g %g", x[0][15], x[1][0]);
  /* Both ranks split from this one thread, grouped (each rank's split
   * waits for the other's): the children are written at the group's end. */
  ncclComm_t kids[2] = {NULL, NULL};
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommSplit(two[0], 0, 1, &kids[0], NULL));
  NCCL_OK(ncclCommSplit(two[1], 0, 0, &kids[1], NULL));
  NCCL_OK(ncclGroupEnd());
  CHECK(kids[0] != NULL && kids[1] != NULL, "grouped split gave %p %p", (void *)kids[0], (void *)kids[1]);
  if (kids[0] && kids[1]) {
    int k0 = -1, k1 = -1;
    NCCL_OK(ncclCommUserRank(kids[0], &k0));
    NCCL_OK(ncclCommUserRank(kids[1], &k1));
    CHECK(k0 == 1 && k1 == 0, "keys reorder the children: %d %d", k0, k1);
    NCCL_OK(ncclCommDestroy(kids[0]));
    NCCL_OK(ncclCommDestroy(kids[1]));
  }
  NCCL_OK(ncclCommDestroy(two[0]));
  NCCL_OK(ncclCommDestroy(two[1]));
  /* A 1-rank communicator from an id nobody generated (PyTorch's self
   * send/recv does this): it must not contact any root. */
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  ncclComm_t self;
  NCCL_OK(ncclCommInitRank(&self, 1, zero, 0));
  int64_t s1[4] = {7, 7, 7, 7}, r1[4] = {0};
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(s1, 4, ncclInt64, 0, self, NULL));
  NCCL_OK(ncclRecv(r1, 4, ncclInt64, 0, self, NULL));
  NCCL_OK(ncclGroupEnd());
  CHECK(r1[3] == 7, "self send/recv: %lld", (long long)r1[3]);
  NCCL_OK(ncclCommDestroy(self));
  NCCL_OK(ncclCommDestroy(comm));
}

/* Split by parity, keys reversed; a NOCOLOR rank gets NULL. */
static void scenario_split(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  int n = g_nranks, me = g_rank;
  ncclComm_t child = (ncclComm_t)0x1;
  NCCL_OK(ncclCommSplit(comm, me % 2, -me, &child, NULL));
  CHECK(child != NULL, "no child");
  if (!child) return;
  int cn = 0, cr = -1;
  NCCL_OK(ncclCommCount(child, &cn));
  NCCL_OK(ncclCommUserRank(child, &cr));
  int members = 0, above = 0;
  for (int r = 0; r < n; r++)
    if (r % 2 == me % 2) { members++; if (r > me) above++; }
  CHECK(cn == members && cr == above, "child count %d rank %d, want %d %d", cn, cr, members, above);
  int32_t v[3] = {me, me, me};
  NCCL_OK(ncclAllReduce(v, v, 3, ncclInt32, ncclSum, child, NULL));
  int want = 0;
  for (int r = 0; r < n; r++) if (r % 2 == me % 2) want += r;
  CHECK(v[2] == want, "child allreduce %d want %d", v[2], want);
  NCCL_OK(ncclCommDestroy(child));
  /* Rank 0 stays out of the second split. */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  ncclComm_t c2 = (ncclComm_t)0x1;
  NCCL_OK(ncclCommSplit(comm, me == 0 ? NCCL_SPLIT_NOCOLOR : 7, 0, &c2, &cfg));
  if (me == 0) CHECK(c2 == NULL, "NOCOLOR rank got %p", (void *)c2);
  else {
    CHECK(c2 != NULL, "no second child");
    if (c2) {
      NCCL_OK(ncclCommCount(c2, &cn));
      CHECK(cn == n - 1, "second child has %d ranks", cn);
      NCCL_OK(ncclCommDestroy(c2));
    }
  }
  /* Shrink away the last rank, which calls it too: it gets NULL at once
   * (scenario shrink_dead: excluded ranks that never call). */
  int ex = n - 1;
  ncclComm_t sh = (ncclComm_t)0x1;
  NCCL_OK(ncclCommShrink(comm, &ex, 1, &sh, NULL, NCCL_SHRINK_DEFAULT));
  if (me == n - 1) CHECK(sh == NULL, "excluded rank got a communicator");
  else if (sh) {
    NCCL_OK(ncclCommCount(sh, &cn));
    CHECK(cn == n - 1, "shrunk to %d ranks", cn);
    NCCL_OK(ncclCommDestroy(sh));
  }
  NCCL_OK(ncclCommDestroy(comm));
}

/* ncclCommInitRankScalable with two ids, each made by the first rank of
 * its block (as torch does): ranks 0..n/2 meet at the first root, the
 * rest at the second; then an AllReduce over all. Bad inputs first:
 * nothing written. */
static void scenario_scalable(void) {
  int n = g_nranks, me = g_rank;
  ncclUniqueId ids[2];
  ncclComm_t keep = (ncclComm_t)0x1;
  CHECK(ncclCommInitRankScalable(&keep, n, me, 0, ids, NULL) == ncclInvalidArgument, "%s", "nId 0");
  CHECK(ncclCommInitRankScalable(&keep, n, me, -1, ids, NULL) == ncclInvalidArgument, "%s", "nId -1");
  CHECK(ncclCommInitRankScalable(&keep, n, me, 2, NULL, NULL) == ncclInvalidArgument, "%s", "NULL ids");
  CHECK(ncclCommInitRankScalable(&keep, 1, 0, 2, ids, NULL) == ncclInvalidArgument, "%s", "2 ids, 1 rank");
  CHECK(ncclCommInitRankScalable(NULL, n, me, 2, ids, NULL) == ncclInvalidArgument, "%s", "NULL comm");
  CHECK(keep == (ncclComm_t)0x1, "%s", "a refused init wrote its output");
  /* NCCL's blocks: the first n % 2 roots take one rank more. */
  int second = (n + 1) / 2;
  if (share_id_by("id0", &ids[0], 0) != 0 || share_id_by("id1", &ids[1], second) != 0) {
    CHECK(0, "%s", "no unique ids");
    return;
  }
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRankScalable(&comm, n, me, 2, ids, NULL));
  int cn = 0, cr = -1;
  NCCL_OK(ncclCommCount(comm, &cn));
  NCCL_OK(ncclCommUserRank(comm, &cr));
  CHECK(cn == n && cr == me, "count %d rank %d", cn, cr);
  int64_t v[9];
  for (int k = 0; k < 9; k++) v[k] = (int64_t)(me + 1) << k;
  NCCL_OK(ncclAllReduce(v, v, 9, ncclInt64, ncclSum, comm, NULL));
  for (int k = 0; k < 9; k++)
    CHECK(v[k] == ((int64_t)n * (n + 1) / 2) << k, "element %d is %lld", k, (long long)v[k]);
  NCCL_OK(ncclCommDestroy(comm));
}

/* The excluded rank's process is killed; the others shrink it away
 * (NCCL_SHRINK_ABORT), never hearing from it again, and the new
 * communicator runs a collective right. The harness expects rank n-1 to
 * die by SIGKILL and every other rank to exit 0. */
static int process_gone(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 1;
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[got] = 0;
  const char *p = strrchr(buf, ')');
  return p && (p[2] == 'Z' || p[2] == 'X');
}

static void scenario_shrink_dead(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  int n = g_nranks, me = g_rank, dead = n - 1;
  int32_t v[5] = {1, 1, 1, 1, 1};
  NCCL_OK(ncclAllReduce(v, v, 5, ncclInt32, ncclSum, comm, NULL));
  CHECK(v[4] == n, "warm-up allreduce %d", v[4]);
  char path[4200];
  snprintf(path, sizeof path, "%s/dying", g_dir);
  if (me == dead) {
    FILE *f = fopen(path, "w");
    if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
    raise(SIGKILL);
  }
  /* Shrink only once the excluded process is really gone (60 s at most). */
  int pid = 0;
  for (int i = 0; i < 6000 && !(pid > 0 && process_gone(pid)); i++) {
    FILE *f = fopen(path, "r");
    if (f) { if (fscanf(f, "%d", &pid) != 1) pid = 0; fclose(f); }
    usleep(10000);
  }
  CHECK(pid > 0 && process_gone(pid), "rank %d's process (pid %d) is still alive", dead, pid);
  ncclComm_t sh = NULL;
  NCCL_OK(ncclCommShrink(comm, &dead, 1, &sh, NULL, NCCL_SHRINK_ABORT));
  CHECK(sh != NULL, "%s", "no shrunk communicator");
  if (!sh) return;
  int cn = 0, cr = -1;
  NCCL_OK(ncclCommCount(sh, &cn));
  NCCL_OK(ncclCommUserRank(sh, &cr));
  CHECK(cn == n - 1 && cr == me, "shrunk count %d rank %d", cn, cr);
  /* Rank r contributes r + 1 in element k: the sum over the survivors,
   * which a dropped, doubled or dead rank's term would change. */
  int32_t w[7];
  for (int k = 0; k < 7; k++) w[k] = (me + 1) * (k + 1);
  NCCL_OK(ncclAllReduce(w, w, 7, ncclInt32, ncclSum, sh, NULL));
  int want = (n - 1) * n / 2;
  for (int k = 0; k < 7; k++) CHECK(w[k] == want * (k + 1), "element %d is %d, want %d", k, w[k], want * (k + 1));
  /* Shrunk again without rank 0, from the shrunk one (ranks renumbered). */
  if (n - 1 >= 2) {
    int first = 0;
    ncclComm_t s2 = (ncclComm_t)0x1;
    NCCL_OK(ncclCommShrink(sh, &first, 1, &s2, NULL, NCCL_SHRINK_DEFAULT));
    if (me == 0) CHECK(s2 == NULL, "%s", "excluded rank 0 got a communicator");
    else if (s2) {
      int32_t x[3] = {me, me, me};
      NCCL_OK(ncclAllReduce(x, x, 3, ncclInt32, ncclMax, s2, NULL));
      CHECK(x[0] == n - 2, "max over ranks 1..%d is %d", n - 2, x[0]);
      NCCL_OK(ncclCommDestroy(s2));
    } else CHECK(0, "%s", "no second shrunk communicator");
  }
  NCCL_OK(ncclCommDestroy(sh));
  ncclCommAbort(comm);
}

/* Ranks as threads (ncclCommInitAll): ranks 0 and 1 shrink rank 2 away
 * from one thread in a group; rank 2 never joins. Then a shrink whose
 * other survivor never calls fails at the deadline (OXCCL_DEADLINE_MS),
 * and bad lists are refused. */
static void scenario_shrink_threads(void) {
  ncclComm_t c[3], s[2] = {NULL, NULL};
  NCCL_OK(ncclCommInitAll(c, 3, NULL));
  int ex = 2;
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++) NCCL_OK(ncclCommShrink(c[i], &ex, 1, &s[i], NULL, NCCL_SHRINK_DEFAULT));
  NCCL_OK(ncclGroupEnd());
  CHECK(s[0] && s[1], "shrunk %p %p", (void *)s[0], (void *)s[1]);
  if (!s[0] || !s[1]) return;
  float v[2][6];
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 6; k++) v[i][k] = (float)(i + 1) * (float)k;
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++) NCCL_OK(ncclAllReduce(v[i], v[i], 6, ncclFloat32, ncclSum, s[i], NULL));
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 6; k++) CHECK(v[i][k] == 3.0f * (float)k, "rank %d element %d is %g", i, k, v[i][k]);
  int cn = 0;
  NCCL_OK(ncclCommCount(s[1], &cn));
  CHECK(cn == 2, "shrunk to %d", cn);
  /* The excluded rank calling it gets NULL at once. */
  ncclComm_t none = (ncclComm_t)0x1;
  NCCL_OK(ncclCommShrink(c[2], &ex, 1, &none, NULL, NCCL_SHRINK_DEFAULT));
  CHECK(none == NULL, "%s", "excluded rank got a communicator");
  /* Bad lists: nothing written. */
  ncclComm_t keep = (ncclComm_t)0x1;
  int bad[2] = {3, -1};
  CHECK(ncclCommShrink(c[0], &bad[0], 1, &keep, NULL, 0) == ncclInvalidArgument, "%s", "rank 3 of 3");
  CHECK(ncclCommShrink(c[0], &bad[1], 1, &keep, NULL, 0) == ncclInvalidArgument, "%s", "rank -1");
  CHECK(ncclCommShrink(c[0], NULL, 1, &keep, NULL, 0) == ncclInvalidArgument, "%s", "NULL list");
  CHECK(ncclCommShrink(c[0], &ex, 3, &keep, NULL, 0) == ncclInvalidArgument, "%s", "count 3");
  CHECK(ncclCommShrink(c[0], &ex, 1, &keep, NULL, 7) == ncclInvalidArgument, "%s", "flags 7");
  CHECK(keep == (ncclComm_t)0x1, "%s", "a refused shrink wrote its output");
  /* Rank 1 never joins: rank 0's shrink fails within the deadline. */
  time_t t0 = time(NULL);
  ncclResult_t r = ncclCommShrink(c[0], &ex, 1, &keep, NULL, NCCL_SHRINK_DEFAULT);
  CHECK(r != ncclSuccess && r != ncclInProgress, "lonely shrink returned %d", (int)r);
  CHECK(time(NULL) - t0 < 30, "lonely shrink took %ld s", (long)(time(NULL) - t0));
  CHECK(strstr(ncclGetLastError(NULL), "for rank 1,") != NULL, "error does not name rank 1: %s", ncclGetLastError(NULL));
  for (int i = 0; i < 2; i++) NCCL_OK(ncclCommDestroy(s[i]));
  for (int i = 0; i < 3; i++) NCCL_OK(ncclCommDestroy(c[i]));
}

/* Rank 1 aborts instead of joining an AllReduce: the others must get an
 * error (not hang, not success), and the aborted handle is dead. */
static void scenario_abort(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  float v[32];
  for (int i = 0; i < 32; i++) v[i] = 1;
  NCCL_OK(ncclAllReduce(v, v, 32, ncclFloat32, ncclSum, comm, NULL));
  CHECK(v[0] == g_nranks, "warm-up allreduce %g", v[0]);
  char path[4200];
  snprintf(path, sizeof path, "%s/warm-%d", g_dir, g_rank);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
  if (g_rank == 1) {
    /* Abort only once every other rank has finished the warm-up. */
    for (int r = 0; r < g_nranks; r++) {
      snprintf(path, sizeof path, "%s/warm-%d", g_dir, r);
      for (int i = 0; i < 6000 && access(path, F_OK) != 0; i++) usleep(10000);
    }
    NCCL_OK(ncclCommAbort(comm));
    int cnt;
    ncclResult_t r = ncclCommCount(comm, &cnt);
    CHECK(r == ncclInvalidArgument, "aborted handle still answers: %d", (int)r);
    return;
  }
  ncclResult_t r = ncclAllReduce(v, v, 32, ncclFloat32, ncclSum, comm, NULL);
  CHECK(r != ncclSuccess && r != ncclInProgress, "allreduce without rank 1 returned %d", (int)r);
  CHECK(strlen(ncclGetLastError(comm)) > 0, "no message");
  ncclResult_t ae = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &ae));
  CHECK(ae != ncclSuccess, "async error still success after a failed call");
  /* Asked with the communicator, the last error is its failure, not this
   * thread's later, unrelated one (what a framework prints after polling
   * ncclCommGetAsyncError). */
  CHECK(ncclGetVersion(NULL) == ncclInvalidArgument, "%s", "NULL version pointer accepted");
  CHECK(strstr(ncclGetLastError(NULL), "version") != NULL, "unrelated error: %s", ncclGetLastError(NULL));
  const char *why = ncclGetLastError(comm);
  CHECK(strlen(why) > 0 && strstr(why, "version") == NULL, "communicator's failure not reported: %s", why);
  NCCL_OK(ncclCommAbort(comm));
}

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static volatile double aborted_at = 0;
static void *abort_later(void *arg) {
  usleep(1000 * 1000);
  aborted_at = mono_s();
  ncclResult_t r = ncclCommAbort((ncclComm_t)arg);
  if (r != ncclSuccess) fprintf(stderr, "abort from a thread: %d\n", (int)r);
  return NULL;
}

/* No deadline by default through the C ABI: rank 0 waits in an AllReduce
 * rank 1 never calls (rank 1 stays alive, so only the abort can end the
 * wait); another thread of rank 0 aborts after 1 s, as a framework's
 * watchdog does, and the call returns an error promptly. The wait warns on
 * stderr without any debug variable (the warning period is shortened by
 * the harness), naming rank 1 and the call. */
static void scenario_abort_thread(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  char path[4200];
  snprintf(path, sizeof path, "%s/done", g_dir);
  if (g_rank == 1) {
    for (int i = 0; i < 12000 && access(path, F_OK) != 0; i++) usleep(10000);
    NCCL_OK(ncclCommAbort(comm));
    return;
  }
  char log[4200];
  snprintf(log, sizeof log, "%s/stderr-0", g_dir);
  fflush(stderr);
  int saved = dup(2);
  int fd = open(log, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  CHECK(saved >= 0 && fd >= 0, "%s", "cannot redirect stderr");
  dup2(fd, 2);
  close(fd);
  pthread_t t;
  pthread_create(&t, NULL, abort_later, comm);
  float v[32];
  for (int i = 0; i < 32; i++) v[i] = 1;
  ncclResult_t r = ncclAllReduce(v, v, 32, ncclFloat32, ncclSum, comm, NULL);
  double ended = mono_s();
  pthread_join(t, NULL);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
  CHECK(r != ncclSuccess && r != ncclInProgress, "allreduce ended by abort returned %d", (int)r);
  CHECK(aborted_at > 0, "%s", "the call returned before the abort: a deadline ended it");
  /* The abort wakes the wait at once, and freeing the communicator wakes
   * its peer-watch threads: the call returns within milliseconds. 3 s
   * leaves room for a loaded machine while still telling a missed abort
   * (a hang) apart. */
  CHECK(ended - aborted_at < 3.0, "the call took %.2f s after the abort", ended - aborted_at);
  fprintf(stderr, "rank 0: the call returned %.3f s after the abort\n", ended - aborted_at);
  char text[16384] = {0};
  f = fopen(log, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  CHECK(strstr(text, "WARN") && strstr(text, "still waiting"), "no wait warning on stderr: %s", text);
  CHECK(strstr(text, "rank 1 has not reached it") != NULL, "warning does not name rank 1: %s", text);
  CHECK(strstr(text, "call #1 (allreduce(sum) of 32 x float)") != NULL, "warning does not name the call: %s", text);
}

/* Rank 1's AllReduce is refused for a NULL buffer: the others' matching
 * calls fail at once (no deadline is configured, so only the posted
 * refusal can end them), naming rank 1; the next call lines up. */
static void scenario_refused(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  float v[32];
  for (int i = 0; i < 32; i++) v[i] = 1;
  ncclResult_t r;
  if (g_rank == 1) {
    r = ncclAllReduce(NULL, v, 32, ncclFloat32, ncclSum, comm, NULL);
    CHECK(r == ncclInvalidArgument, "NULL send buffer returned %d", (int)r);
  } else {
    r = ncclAllReduce(v, v, 32, ncclFloat32, ncclSum, comm, NULL);
    CHECK(r == ncclRemoteError, "peer's refused call gave %d", (int)r);
    const char *m = ncclGetLastError(comm);
    CHECK(strstr(m, "peer rank 1 failed call #1") != NULL, "error does not name rank 1: %s", m);
  }
  for (int i = 0; i < 32; i++) v[i] = 1;
  NCCL_OK(ncclAllReduce(v, v, 32, ncclFloat32, ncclSum, comm, NULL));
  CHECK(v[0] == g_nranks, "allreduce after the refusal %g", v[0]);
  NCCL_OK(ncclCommDestroy(comm));
}

/* Inside a group, rank 1's AllReduce (NULL buffer), then its Send (peer
 * out of range) are refused: its ncclGroupEnd returns the refusal, and
 * its peer's group end fails at once (no deadline is configured), naming
 * rank 1 and the reason; the next call lines up. Two ranks. */
static void scenario_group_refused(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  int peer = 1 - g_rank;
  float v[32], w[32];
  for (int i = 0; i < 32; i++) v[i] = 1;
  NCCL_OK(ncclGroupStart());
  ncclResult_t r = ncclAllReduce(g_rank == 1 ? NULL : v, v, 32, ncclFloat32, ncclSum, comm, NULL);
  CHECK(r == (g_rank == 1 ? ncclInvalidArgument : ncclSuccess), "AllReduce in the group returned %d", (int)r);
  r = ncclGroupEnd();
  const char *m = ncclGetLastError(comm);
  if (g_rank == 1) {
    CHECK(r == ncclInvalidArgument, "the refusing rank's group end returned %d", (int)r);
  } else {
    CHECK(r == ncclRemoteError, "the peer's group end returned %d (%s)", (int)r, m);
    CHECK(strstr(m, "peer rank 1 failed call #1") != NULL, "error does not name rank 1: %s", m);
    CHECK(strstr(m, "its arguments were refused") != NULL, "error gives no reason: %s", m);
  }
  NCCL_OK(ncclGroupStart());
  r = ncclSend(v, 32, ncclFloat32, g_rank == 1 ? 7 : peer, comm, NULL);
  CHECK(r == (g_rank == 1 ? ncclInvalidArgument : ncclSuccess), "Send in the group returned %d", (int)r);
  NCCL_OK(ncclRecv(w, 32, ncclFloat32, peer, comm, NULL));
  r = ncclGroupEnd();
  m = ncclGetLastError(comm);
  if (g_rank == 1) {
    CHECK(r == ncclInvalidArgument, "the refusing rank's group end returned %d", (int)r);
  } else {
    CHECK(r == ncclRemoteError, "the peer's Send/Recv group end returned %d (%s)", (int)r, m);
    CHECK(strstr(m, "peer rank 1 failed its group") != NULL, "error does not name rank 1: %s", m);
  }
  /* A lone Send, refused outside a group: the peer's Recv fails at once. */
  if (g_rank == 1) {
    r = ncclSend(v, 32, ncclFloat32, 7, comm, NULL);
    CHECK(r == ncclInvalidArgument, "a lone Send to rank 7 returned %d", (int)r);
  } else {
    r = ncclRecv(w, 32, ncclFloat32, 1, comm, NULL);
    m = ncclGetLastError(comm);
    CHECK(r == ncclRemoteError, "the peer's lone Recv returned %d (%s)", (int)r, m);
    CHECK(strstr(m, "peer rank 1 failed its group") != NULL, "error does not name rank 1: %s", m);
  }
  for (int i = 0; i < 32; i++) v[i] = 1;
  NCCL_OK(ncclAllReduce(v, v, 32, ncclFloat32, ncclSum, comm, NULL));
  CHECK(v[0] == g_nranks, "allreduce after the refusals %g", v[0]);
  NCCL_OK(ncclCommDestroy(comm));
}

static volatile int stop_watch = 0;
static void *watch(void *arg) {
  ncclComm_t comm = (ncclComm_t)arg;
  long polls = 0;
  while (!stop_watch) {
    ncclResult_t e;
    if (ncclCommGetAsyncError(comm, &e) != ncclSuccess) return (void *)1;
    polls++;
  }
  return polls > 0 ? NULL : (void *)1;
}

/* A nonblocking init polled to completion, with another thread polling
 * GetAsyncError all along. */
static void scenario_nonblocking(void) {
  ncclUniqueId id;
  if (share_id("id", &id) != 0) { failures++; return; }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "nonblocking-test";
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, g_nranks, id, g_rank, &cfg);
  CHECK(r == ncclInProgress || r == ncclSuccess, "init returned %d", (int)r);
  CHECK(comm != NULL, "handle not written at once");
  if (!comm) return;
  pthread_t th;
  pthread_create(&th, NULL, watch, comm);
  ncclResult_t st = ncclInProgress;
  for (int i = 0; i < 60000 && st == ncclInProgress; i++) {
    NCCL_OK(ncclCommGetAsyncError(comm, &st));
    if (st == ncclInProgress) usleep(1000);
  }
  CHECK(st == ncclSuccess, "init ended with %d: %s", (int)st, ncclGetLastError(comm));
  double d[5] = {1, 2, 3, 4, 5};
  r = ncclAllReduce(d, d, 5, ncclFloat64, ncclMax, comm, NULL);
  CHECK(r == ncclSuccess || r == ncclInProgress, "allreduce %d", (int)r);
  do { NCCL_OK(ncclCommGetAsyncError(comm, &st)); } while (st == ncclInProgress);
  CHECK(d[4] == 5 && d[0] == 1, "max %g %g", d[0], d[4]);
  stop_watch = 1;
  void *res;
  pthread_join(th, &res);
  CHECK(res == NULL, "watcher thread failed");
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
}

/* Polls a nonblocking communicator's state until it is not in progress. */
static ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  for (int i = 0; i < 60000 && st == ncclInProgress; i++) {
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return ncclInternalError;
    if (st == ncclInProgress) usleep(1000);
  }
  return st;
}

/* Nonblocking split (children inherit the parent's blocking = 0) and
 * group end: each returns ncclInProgress at once, with the child's handle
 * written, and finishes in the background. */
static void scenario_nonblocking_split(void) {
  ncclUniqueId id;
  if (share_id("id", &id) != 0) { failures++; return; }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, g_nranks, id, g_rank, &cfg);
  CHECK(r == ncclInProgress && comm != NULL, "init returned %d", (int)r);
  if (!comm) return;
  CHECK(settle(comm) == ncclSuccess, "init: %s", ncclGetLastError(comm));

  /* Every rank in one child, ranked in reverse. */
  ncclComm_t child = NULL;
  r = ncclCommSplit(comm, 7, g_nranks - g_rank, &child, NULL);
  CHECK(r == ncclInProgress, "split returned %d", (int)r);
  CHECK(child != NULL, "%s", "the child's handle is written at once");
  if (!child) return;
  CHECK(settle(child) == ncclSuccess, "split: %s", ncclGetLastError(child));
  CHECK(settle(comm) == ncclSuccess, "parent after split: %s", ncclGetLastError(comm));
  int cnt = 0, rk = -1;
  NCCL_OK(ncclCommCount(child, &cnt));
  NCCL_OK(ncclCommUserRank(child, &rk));
  CHECK(cnt == g_nranks && rk == g_nranks - 1 - g_rank, "child count %d rank %d", cnt, rk);

  /* A group end on nonblocking communicators: AllReduce on the child and
   * a ring of Send/Recv on the parent. */
  int64_t v = g_rank + 1, got = -1, mine = 100 + g_rank;
  int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclInt64, ncclSum, child, NULL));
  NCCL_OK(ncclSend(&mine, 1, ncclInt64, next, comm, NULL));
  NCCL_OK(ncclRecv(&got, 1, ncclInt64, prev, comm, NULL));
  r = ncclGroupEnd();
  CHECK(r == ncclInProgress, "group end returned %d", (int)r);
  CHECK(settle(child) == ncclSuccess, "group on the child: %s", ncclGetLastError(child));
  CHECK(settle(comm) == ncclSuccess, "group on the parent: %s", ncclGetLastError(comm));
  CHECK(v == (int64_t)g_nranks * (g_nranks + 1) / 2, "allreduce %lld", (long long)v);
  CHECK(got == 100 + prev, "received %lld from %d", (long long)got, prev);

  /* The last rank takes no part: its child is NULL at once, and its
   * parent is in progress until the others have split. */
  ncclComm_t part = (ncclComm_t)&part;
  r = ncclCommSplit(comm, g_rank == g_nranks - 1 ? NCCL_SPLIT_NOCOLOR : 0, g_rank, &part, NULL);
  CHECK(r == ncclInProgress, "second split returned %d", (int)r);
  CHECK(settle(comm) == ncclSuccess, "parent after the second split: %s", ncclGetLastError(comm));
  if (g_rank == g_nranks - 1) {
    CHECK(part == NULL, "%s", "a NOCOLOR rank gets NULL");
  } else if (part != NULL) {
    CHECK(settle(part) == ncclSuccess, "second split: %s", ncclGetLastError(part));
    NCCL_OK(ncclCommCount(part, &cnt));
    CHECK(cnt == g_nranks - 1, "second child has %d ranks", cnt);
    NCCL_OK(ncclCommDestroy(part));
  } else {
    CHECK(0, "%s", "a coloured rank got NULL");
  }
  NCCL_OK(ncclCommDestroy(child));
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
}

/* One group whose operations name different streams (host backend: the
 * streams are ignored, but the group must not be refused). */
static void scenario_streams(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  cudaStream_t s1 = (cudaStream_t)(uintptr_t)0x1000, s2 = (cudaStream_t)(uintptr_t)0x2000,
               s3 = (cudaStream_t)(uintptr_t)0x3000;
  int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
  float v[3] = {1, 2, (float)g_rank};
  int32_t mine = 10 + g_rank, got = -1;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(v, v, 3, ncclFloat32, ncclSum, comm, s1));
  NCCL_OK(ncclSend(&mine, 1, ncclInt32, next, comm, s2));
  NCCL_OK(ncclRecv(&got, 1, ncclInt32, prev, comm, s3));
  NCCL_OK(ncclGroupEnd());
  CHECK(v[0] == g_nranks && v[1] == 2 * g_nranks, "allreduce %g %g", v[0], v[1]);
  CHECK(v[2] == g_nranks * (g_nranks - 1) / 2, "allreduce of ranks %g", v[2]);
  CHECK(got == 10 + prev, "received %d from %d", got, prev);
  NCCL_OK(ncclCommDestroy(comm));
}

/* Every configuration layout from 2.17 to 2.30, on 1-rank communicators. */
static void scenario_configs(void) {
  static const struct { size_t size; unsigned version; } L[] = {
      {48, 21700}, {48, 22600}, {72, 22700}, {80, 22809}, {88, 22900}, {96, 23000}};
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
    union { char b[128]; size_t align; } u;
    memset(u.b, 0x80, sizeof u.b); /* INT_MIN-ish garbage beyond the layout */
    int undef = NCCL_CONFIG_UNDEF_INT;
    for (size_t off = 16; off + 4 <= L[i].size; off += 4) memcpy(u.b + off, &undef, 4);
    memset(u.b + 32, 0, 8);                 /* netName */
    if (L[i].size >= 56) memset(u.b + 48, 0, 8); /* commName */
    memcpy(u.b, &L[i].size, sizeof(size_t));
    unsigned magic = 0xcafebeef;
    memcpy(u.b + 8, &magic, 4);
    memcpy(u.b + 12, &L[i].version, 4);
    int blocking = 1;
    memcpy(u.b + 16, &blocking, 4);
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&c, 1, zero, 0, (ncclConfig_t *)u.b);
    CHECK(r == ncclSuccess, "layout %zu/%u: %d %s", L[i].size, L[i].version, (int)r, ncclGetLastError(NULL));
    if (r == ncclSuccess) NCCL_OK(ncclCommDestroy(c));
  }
}

/* Bad arguments: the right code, a message, and nothing written. */
static void scenario_badargs(void) {
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, 1, zero, 0));
  float in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[9];
  for (int i = 0; i < 9; i++) out[i] = -1;
  int fake_storage[64];
  ncclComm_t foreign = (ncclComm_t)fake_storage;
  BAD(ncclAllReduce(in, out, 8, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument, "NULL");
  BAD(ncclAllReduce(in, out, 8, ncclFloat32, ncclSum, foreign, NULL), ncclInvalidArgument, "not a live");
  BAD(ncclAllReduce(in, out, 8, (ncclDataType_t)12, ncclSum, comm, NULL), ncclInvalidArgument, "datatype 12");
  BAD(ncclAllReduce(in, out, 8, (ncclDataType_t)-1, ncclSum, comm, NULL), ncclInvalidArgument, "datatype -1");
  BAD(ncclAllReduce(in, out, 8, ncclFloat32, (ncclRedOp_t)5, comm, NULL), ncclInvalidArgument, "PreMulSum");
  BAD(ncclAllReduce(in, out, 8, ncclFloat32, (ncclRedOp_t)-3, comm, NULL), ncclInvalidArgument, "op -3");
  BAD(ncclAllReduce(NULL, out, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "sendbuff");
  BAD(ncclAllReduce(in, NULL, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "recvbuff");
  BAD(ncclAllReduce(in, (char *)out + 1, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "aligned");
  BAD(ncclAllReduce(in, out, SIZE_MAX / 2, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "overflow");
  BAD(ncclAllGather(in, out, SIZE_MAX / 2 + 1, ncclInt8, comm, NULL), ncclInvalidArgument, "overflow");
  BAD(ncclBroadcast(in, out, 8, ncclFloat32, 1, comm, NULL), ncclInvalidArgument, "root 1");
  BAD(ncclReduce(in, out, 8, ncclFloat32, ncclSum, -1, comm, NULL), ncclInvalidArgument, "root -1");
  BAD(ncclSend(in, 8, ncclFloat32, 2, comm, NULL), ncclInvalidArgument, "peer 2");
  BAD(ncclRecv(out, 8, ncclFloat32, -1, comm, NULL), ncclInvalidArgument, "peer -1");
  for (int i = 0; i < 9; i++) CHECK(out[i] == -1, "out[%d] written: %g", i, out[i]);
  /* Output parameters are left alone on errors. */
  int v = 1234;
  BAD(ncclCommCount(foreign, &v), ncclInvalidArgument, "not a live");
  CHECK(v == 1234, "count written on error");
  BAD(ncclCommCount(comm, NULL), ncclInvalidArgument, "count is NULL");
  BAD(ncclGetVersion(NULL), ncclInvalidArgument, "NULL");
  ncclComm_t keep = (ncclComm_t)0x42;
  BAD(ncclCommInitRank(&keep, 0, zero, 0), ncclInvalidArgument, "nranks");
  /* Every bad rank count, from every init: InvalidArgument, nothing written. */
  static const int bad_n[] = {0, -1, INT_MIN, INT_MAX, (1 << 14) + 1};
  for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; i++) {
    int n = bad_n[i];
    BAD(ncclCommInitRank(&keep, n, zero, 0), ncclInvalidArgument, "nranks");
    ncclConfig_t c0 = NCCL_CONFIG_INITIALIZER;
    BAD(ncclCommInitRankConfig(&keep, n, zero, 0, &c0), ncclInvalidArgument, "nranks");
    BAD(ncclCommInitRankScalable(&keep, n, 0, 1, &zero, NULL), ncclInvalidArgument, "nranks");
    BAD(ncclCommInitAll(&keep, n, NULL), ncclInvalidArgument, "nranks");
  }
  CHECK(keep == (ncclComm_t)0x42, "comm written by an init with a bad rank count");
  BAD(ncclCommInitRank(&keep, 2, zero, 2), ncclInvalidArgument, "rank 2");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  BAD(ncclCommInitRankConfig(&keep, 1, zero, 0, &cfg), ncclInvalidArgument, "magic");
  ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
  cfg2.blocking = 2;
  BAD(ncclCommInitRankConfig(&keep, 1, zero, 0, &cfg2), ncclInvalidArgument, "blocking");
  CHECK(keep == (ncclComm_t)0x42, "comm written on a failed init");
  BAD(ncclCommSplit(comm, -5, 0, &keep, NULL), ncclInvalidArgument, "color -5");
  /* PreMulSum ops belong to their communicator and their type. */
  ncclComm_t other;
  NCCL_OK(ncclCommInitRank(&other, 1, zero, 0));
  ncclRedOp_t op;
  float two = 2;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat32, ncclScalarHostImmediate, comm));
  BAD(ncclAllReduce(in, out, 8, ncclFloat32, op, other, NULL), ncclInvalidArgument, "not a PreMulSum op of this");
  BAD(ncclAllReduce(in, out, 8, ncclFloat64, op, comm, NULL), ncclInvalidArgument, "made for");
  BAD(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "not a live PreMulSum");
  BAD(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat32, 7, comm), ncclInvalidArgument, "residence 7");
  NCCL_OK(ncclRedOpDestroy(op, comm));
  BAD(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "not a live PreMulSum");
  NCCL_OK(ncclCommDestroy(other));
  BAD(ncclCommDestroy(other), ncclInvalidArgument, "not a live");
  BAD(ncclAllReduce(in, out, 8, ncclFloat32, ncclSum, other, NULL), ncclInvalidArgument, "not a live");
  /* A stale handle never reaches a communicator made after its destroy or
     abort (whatever memory the new one reuses), and is never dereferenced. */
  for (int i = 0; i < 20; i++) {
    ncclComm_t fresh, gone = other;
    NCCL_OK(ncclCommInitRank(&fresh, 1, zero, 0));
    CHECK(fresh != gone, "a new communicator got the stale handle %p", (void *)gone);
    int cnt = -7;
    BAD(ncclCommCount(gone, &cnt), ncclInvalidArgument, "not a live");
    CHECK(cnt == -7, "count written through a stale handle");
    BAD(ncclAllReduce(in, out, 8, ncclFloat32, ncclSum, gone, NULL), ncclInvalidArgument, "not a live");
    BAD(ncclCommAbort(gone), ncclInvalidArgument, "not a live");
    NCCL_OK(ncclCommCount(fresh, &cnt));
    CHECK(cnt == 1, "the fresh communicator has %d ranks", cnt);
    if (i % 2) NCCL_OK(ncclCommAbort(fresh)); else NCCL_OK(ncclCommDestroy(fresh));
    other = fresh;
  }
  for (int i = 0; i < 9; i++) CHECK(out[i] == -1, "out[%d] written through a stale handle: %g", i, out[i]);
  /* Groups: an end without a start; a bad call fails the whole group. */
  BAD(ncclGroupEnd(), ncclInvalidUsage, "without ncclGroupStart");
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(in, out, 8, ncclFloat32, ncclSum, comm, NULL));
  BAD(ncclAllReduce(in, out, 8, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument, "datatype 99");
  BAD(ncclGroupEnd(), ncclInvalidArgument, "datatype 99");
  for (int i = 0; i < 9; i++) CHECK(out[i] == -1, "out[%d] written by a failed group: %g", i, out[i]);
  /* Not supported yet: a clear InvalidUsage. */
  BAD(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage, "not supported");
  /* Registration and ncclMemAlloc (host memory on the host backend). */
  void *h = NULL, *mem = NULL;
  NCCL_OK(ncclCommRegister(comm, in, sizeof in, &h));
  BAD(ncclCommDeregister(comm, (void *)0x1234), ncclInvalidArgument, "not a registration");
  NCCL_OK(ncclCommDeregister(comm, h));
  NCCL_OK(ncclMemAlloc(&mem, 1 << 20));
  CHECK(mem != NULL && ((uintptr_t)mem & 4095) == 0, "ncclMemAlloc gave %p", mem);
  float *fm = mem;
  for (int i = 0; i < 8; i++) fm[i] = (float)i;
  NCCL_OK(ncclAllReduce(fm, fm + 8, 8, ncclFloat32, ncclSum, comm, NULL));
  CHECK(fm[15] == 7, "allreduce on ncclMemAlloc memory: %g", fm[15]);
  NCCL_OK(ncclMemFree(mem));
  BAD(ncclMemFree(mem), ncclInvalidArgument, "not allocated by ncclMemAlloc");
  /* Error strings. */
  for (int r = 0; r <= 7; r++) CHECK(strlen(ncclGetErrorString((ncclResult_t)r)) > 0, "no string for %d", r);
  CHECK(strstr(ncclGetErrorString((ncclResult_t)99), "unknown") != NULL, "unknown code string");
  ncclSimInfo_t si = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(in, out, 8, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(&si));
  CHECK(si.estimatedTime >= 0, "simulated time %g", si.estimatedTime);
  CHECK(out[0] == -1, "a simulated group ran");
  NCCL_OK(ncclCommDestroy(comm));
}

/* Element k of rank r's window data. */
static float win_input(int r, size_t k) { return (float)(r + 1) + (float)(k % 97); }

/* AllReduce, AllGather, ReduceScatter and Broadcast on buffers inside
 * `base` (a window of `comm`, rank `me` of `n`), results checked. */
static void window_colls(ncclComm_t comm, float *base, int me, int n, const char *how) {
  const size_t c = 1000;
  float *in = base, *out = base + c * (size_t)n;
  for (size_t k = 0; k < c * (size_t)n; k++) in[k] = win_input(me, k);
  for (size_t k = 0; k < c * (size_t)n; k++) out[k] = -1;
  NCCL_OK(ncclAllReduce(in, out, c, ncclFloat32, ncclSum, comm, NULL));
  int bad = 0;
  for (size_t k = 0; k < c; k++) {
    float want = 0;
    for (int r = 0; r < n; r++) want += win_input(r, k);
    bad += out[k] != want;
  }
  CHECK(bad == 0, "%s: allreduce on a window: %d wrong (out[0] %g)", how, bad, out[0]);
  NCCL_OK(ncclAllGather(in, out, c, ncclFloat32, comm, NULL));
  bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t k = 0; k < c; k++) bad += out[(size_t)r * c + k] != win_input(r, k);
  CHECK(bad == 0, "%s: allgather on a window: %d wrong", how, bad);
  NCCL_OK(ncclReduceScatter(in, out, c, ncclFloat32, ncclMax, comm, NULL));
  bad = 0;
  for (size_t k = 0; k < c; k++) bad += out[k] != win_input(n - 1, (size_t)me * c + k);
  CHECK(bad == 0, "%s: reducescatter on a window: %d wrong", how, bad);
  NCCL_OK(ncclBroadcast(in, out, c, ncclFloat32, 0, comm, NULL));
  bad = 0;
  for (size_t k = 0; k < c; k++) bad += out[k] != win_input(0, k);
  CHECK(bad == 0, "%s: broadcast on a window: %d wrong", how, bad);
}

/* Windows: ncclMemAlloc (host memory here, and size 0), registration on
 * every rank, collectives on window buffers, ncclWinGetUserPtr, bad
 * arguments refused with nothing written, stale handles refused; then
 * the same on ranks that are threads of this process. */
static void scenario_windows(void) {
  void *none = (void *)0x1;
  NCCL_OK(ncclMemAlloc(&none, 0));
  CHECK(none == NULL, "ncclMemAlloc of 0 bytes gave %p", none);
  NCCL_OK(ncclMemFree(NULL));
  ncclComm_t comm = world("id");
  if (!comm) return;
  const size_t bytes = 1 << 20;
  void *mem = NULL;
  NCCL_OK(ncclMemAlloc(&mem, bytes));
  CHECK(mem != NULL && ((uintptr_t)mem % NCCL_WIN_REQUIRED_ALIGNMENT) == 0, "ncclMemAlloc gave %p", mem);
  if (!mem) return;
  ncclWindow_t win = NULL;
  NCCL_OK(ncclCommWindowRegister(comm, mem, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(win != NULL && win != (ncclWindow_t)mem, "window handle %p", (void *)win);
  void *up = NULL;
  NCCL_OK(ncclWinGetUserPtr(comm, win, &up));
  CHECK(up == mem, "ncclWinGetUserPtr gave %p, registered %p", up, mem);
  window_colls(comm, mem, g_rank, g_nranks, "processes");

  /* Bad arguments: the right code, the output left alone. */
  ncclWindow_t keep = (ncclWindow_t)0x40;
  int fake_storage[64];
  ncclComm_t foreign = (ncclComm_t)fake_storage;
  BAD(ncclCommWindowRegister(comm, (char *)mem + 64, 4096, &keep, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidArgument, "NCCL_WIN_REQUIRED_ALIGNMENT");
  BAD(ncclCommWindowRegister(comm, NULL, 4096, &keep, 0), ncclInvalidArgument, "NULL");
  BAD(ncclCommWindowRegister(comm, mem, 0, &keep, 0), ncclInvalidArgument, "size is 0");
  BAD(ncclCommWindowRegister(comm, mem, SIZE_MAX, &keep, 0), ncclInvalidArgument, "overflow");
  BAD(ncclCommWindowRegister(comm, mem, bytes, NULL, 0), ncclInvalidArgument, "win is NULL");
  BAD(ncclCommWindowRegister(foreign, mem, bytes, &keep, 0), ncclInvalidArgument, "not a live");
  BAD(ncclCommWindowRegister(NULL, mem, bytes, &keep, 0), ncclInvalidArgument, "NULL");
  CHECK(keep == (ncclWindow_t)0x40, "a refused registration wrote %p", (void *)keep);
  up = (void *)0x80;
  BAD(ncclWinGetUserPtr(comm, (ncclWindow_t)mem, &up), ncclInvalidArgument, "not a live window");
  BAD(ncclWinGetUserPtr(comm, win, NULL), ncclInvalidArgument, "NULL");
  BAD(ncclWinGetUserPtr(foreign, win, &up), ncclInvalidArgument, "not a live");
  BAD(ncclCommWindowDeregister(comm, NULL), ncclInvalidArgument, "win is NULL");
  BAD(ncclCommWindowDeregister(comm, (ncclWindow_t)0x1234), ncclInvalidArgument, "not a live window");
  /* A window belongs to the communicator that made it. */
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  ncclComm_t other = NULL;
  NCCL_OK(ncclCommInitRank(&other, 1, zero, 0));
  BAD(ncclWinGetUserPtr(other, win, &up), ncclInvalidArgument, "not a live window");
  BAD(ncclCommWindowDeregister(other, win), ncclInvalidArgument, "not a live window");
  CHECK(up == (void *)0x80, "a refused ncclWinGetUserPtr wrote %p", up);
  /* Unaligned without the symmetric flag, and unknown flags: accepted. */
  ncclWindow_t w2 = NULL;
  NCCL_OK(ncclCommWindowRegister(other, (char *)mem + 64, 4096, &w2, NCCL_WIN_STRICT_ORDERING | 0x100));
  NCCL_OK(ncclWinGetUserPtr(other, w2, &up));
  CHECK(up == (char *)mem + 64, "second window's pointer %p", up);
  CHECK(w2 != win, "%s", "two windows got one handle");
  NCCL_OK(ncclCommWindowDeregister(other, w2));
  NCCL_OK(ncclCommDestroy(other));

  /* Deregistered: the handle is stale for good; calls on the memory still run. */
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  up = (void *)0x80;
  BAD(ncclWinGetUserPtr(comm, win, &up), ncclInvalidArgument, "not a live window");
  CHECK(up == (void *)0x80, "a stale ncclWinGetUserPtr wrote %p", up);
  BAD(ncclCommWindowDeregister(comm, win), ncclInvalidArgument, "not a live window");
  window_colls(comm, mem, g_rank, g_nranks, "after deregistering");
  NCCL_OK(ncclCommDestroy(comm));
  NCCL_OK(ncclMemFree(mem));
  BAD(ncclMemFree(mem), ncclInvalidArgument, "not allocated by ncclMemAlloc");

  /* Ranks as threads of this process: every rank's window is reached
   * by every other rank (the direct plans). One thread drives them all,
   * so each collective is a group. */
  if (g_rank != 0) return;
  enum { T = 3 };
  ncclComm_t c[T];
  void *m[T];
  ncclWindow_t w[T];
  NCCL_OK(ncclCommInitAll(c, T, NULL));
  for (int i = 0; i < T; i++) {
    NCCL_OK(ncclMemAlloc(&m[i], bytes));
    NCCL_OK(ncclCommWindowRegister(c[i], m[i], bytes, &w[i], NCCL_WIN_COLL_SYMMETRIC));
  }
  const size_t cnt = 4096;
  for (int i = 0; i < T; i++)
    for (size_t k = 0; k < cnt; k++) ((float *)m[i])[k] = win_input(i, k);
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < T; i++) NCCL_OK(ncclAllReduce(m[i], (float *)m[i] + cnt, cnt, ncclFloat32, ncclSum, c[i], NULL));
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < T; i++) {
    int bad = 0;
    for (size_t k = 0; k < cnt; k++) {
      float want = 0;
      for (int r = 0; r < T; r++) want += win_input(r, k);
      bad += ((float *)m[i])[cnt + k] != want;
    }
    CHECK(bad == 0, "threads: rank %d allreduce on windows: %d wrong", i, bad);
  }
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < T; i++) NCCL_OK(ncclAllGather(m[i], (float *)m[i] + cnt, cnt, ncclFloat32, c[i], NULL));
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < T; i++) {
    int bad = 0;
    for (int r = 0; r < T; r++)
      for (size_t k = 0; k < cnt; k++) bad += ((float *)m[i])[cnt + (size_t)r * cnt + k] != win_input(r, k);
    CHECK(bad == 0, "threads: rank %d allgather on windows: %d wrong", i, bad);
  }
  /* Another rank's window is not this rank's. */
  BAD(ncclCommWindowDeregister(c[1], w[0]), ncclInvalidArgument, "not a live window");
  for (int i = 0; i < T; i++) {
    NCCL_OK(ncclWinGetUserPtr(c[i], w[i], &up));
    CHECK(up == m[i], "threads: rank %d window pointer %p, registered %p", i, up, m[i]);
    NCCL_OK(ncclCommWindowDeregister(c[i], w[i]));
  }
  for (int i = 0; i < T; i++) {
    NCCL_OK(ncclCommDestroy(c[i]));
    NCCL_OK(ncclMemFree(m[i]));
  }
}

/* NCCL_COMM_ID names the root: every rank makes the same id itself. */
static void scenario_commid(void) {
  ncclUniqueId id;
  ncclComm_t comm;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, g_nranks, id, g_rank));
  int32_t v[4] = {1, 1, 1, 1};
  NCCL_OK(ncclAllReduce(v, v, 4, ncclInt32, ncclSum, comm, NULL));
  CHECK(v[3] == g_nranks, "allreduce over NCCL_COMM_ID: %d", v[3]);
  NCCL_OK(ncclCommDestroy(comm));
}

/* ---------- NCCL 2.28.7-2.30 additions ---------- */

/* Every process has reached `name` (files DIR/name.RANK), at most 60 s:
 * a barrier outside the library, for a call that must not overlap any
 * rank's earlier one (a rank leaves a collective before its peers do). */
static int arrive(const char *name) {
  char path[4300];
  char base[200];
  snprintf(base, sizeof base, "%s.%d", name, g_rank);
  id_path(path, sizeof path, base);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  fclose(f);
  for (int i = 0; i < 6000; i++) {
    int all = 1;
    for (int r = 0; r < g_nranks && all; r++) {
      snprintf(base, sizeof base, "%s.%d", name, r);
      id_path(path, sizeof path, base);
      all = access(path, F_OK) == 0;
    }
    if (all) return 0;
    usleep(10000);
  }
  return -1;
}

static int last_error_says(ncclComm_t comm, const char *what) {
  const char *m = ncclGetLastError(comm);
  return m && strstr(m, what) != NULL;
}

/* Profiling twins, memory statistics, suspend/resume, one-sided calls
 * (refused) and revoke followed by shrink. */
static void scenario_newer(void) {
  ncclComm_t comm = world("id");
  if (!comm) return;
  int n = g_nranks, cnt = 0;
  NCCL_OK(pncclCommCount(comm, &cnt));
  CHECK(cnt == n, "pncclCommCount gave %d", cnt);
  int64_t v[4] = {g_rank, 1, 2, 3};
  NCCL_OK(pncclAllReduce(v, v, 4, ncclInt64, ncclSum, comm, NULL));
  CHECK(v[0] == (int64_t)n * (n - 1) / 2 && v[1] == n, "pncclAllReduce gave %lld %lld", (long long)v[0], (long long)v[1]);

  uint64_t st = 99;
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &st));
  CHECK(st == 0, "suspendable bytes %llu", (unsigned long long)st);
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &st));
  CHECK(st == 0, "suspended flag %llu before suspend", (unsigned long long)st);
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &st));
  CHECK(st == 0, "the host backend holds %llu GPU bytes", (unsigned long long)st);
  st = 77;
  CHECK(ncclCommMemStats(comm, (ncclCommMemStat_t)9, &st) == ncclInvalidArgument && st == 77, "bad stat: %llu", (unsigned long long)st);

  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &st));
  CHECK(st == 1, "suspended flag %llu after suspend", (unsigned long long)st);
  CHECK(ncclAllReduce(v, v, 4, ncclInt64, ncclSum, comm, NULL) == ncclInvalidUsage, "a suspended communicator ran a call");
  CHECK(last_error_says(comm, "suspended"), "message: %s", ncclGetLastError(comm));
  NCCL_OK(ncclCommResume(comm));
  CHECK(ncclCommResume(comm) == ncclInvalidUsage, "resume of a running communicator");
  CHECK(ncclCommSuspend(comm, 4) == ncclInvalidArgument, "unknown suspend flag accepted");
  v[0] = 1;
  NCCL_OK(ncclAllReduce(v, v, 1, ncclInt64, ncclSum, comm, NULL));
  CHECK(v[0] == n, "allreduce after resume: %lld", (long long)v[0]);

  CHECK(ncclSignal(0, 0, 0, 0, comm, NULL) == ncclInvalidUsage && last_error_says(comm, "one-sided"), "ncclSignal: %s", ncclGetLastError(comm));
  void *up = &st;
  CHECK(ncclWinGetUserPtr(comm, NULL, &up) == ncclInvalidArgument && up == (void *)&st, "ncclWinGetUserPtr wrote %p", up);
  ncclWaitSignalDesc_t d = {1, 0, 0, 0};
  CHECK(ncclWaitSignal(1, &d, comm, NULL) == ncclInvalidUsage, "%s", "ncclWaitSignal");
  CHECK(ncclPutSignal(v, 1, ncclInt64, 0, NULL, 0, 0, 0, 0, comm, NULL) == ncclInvalidUsage, "%s", "ncclPutSignal");

  /* Parameters: the settings table by variable name. */
  ncclParamHandle_t ph = NULL, ph2 = NULL;
  int32_t i32 = 0;
  const char *str = NULL, **keys = NULL;
  int klen = 0, vlen = -1;
  CHECK(ncclParamBind(&ph, "NCCL_NO_SUCH_PARAMETER") == ncclInvalidArgument && ph == NULL, "%s", "an unknown key bound");
  setenv("OXCCL_WAIT_WARN_EVERY_MS", "12345", 1);
  NCCL_OK(ncclParamBind(&ph, "OXCCL_WAIT_WARN_EVERY_MS"));
  NCCL_OK(ncclParamBind(&ph2, "OXCCL_WAIT_WARN_EVERY_MS"));
  CHECK(ph == ph2, "%s", "one key, two handles");
  NCCL_OK(ncclParamGetI32(ph, &i32));
  CHECK(i32 == 12345, "param value %d", (int)i32);
  NCCL_OK(ncclParamGetStr(ph, &str));
  CHECK(str && !strcmp(str, "12345"), "param string %s", str ? str : "(null)");
  NCCL_OK(ncclParamGetParameter("NCCL_ALGO", &str, &vlen));
  CHECK(str && vlen == (int)strlen(str), "NCCL_ALGO value %s length %d", str ? str : "(null)", vlen);
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &klen));
  CHECK(klen > 40 && keys != NULL, "only %d keys", klen);
  unsetenv("OXCCL_WAIT_WARN_EVERY_MS");

  CHECK(ncclCommRevoke(comm, 1) == ncclInvalidArgument, "%s", "revoke flag 1 accepted");
  CHECK(arrive("revoke") == 0, "%s", "the others never reached the revoke");
  NCCL_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  ncclResult_t ae = ncclInProgress;
  NCCL_OK(ncclCommGetAsyncError(comm, &ae));
  CHECK(ae == ncclSuccess, "async error after revoke: %d", (int)ae);
  CHECK(ncclAllReduce(v, v, 1, ncclInt64, ncclSum, comm, NULL) == ncclInvalidUsage && last_error_says(comm, "revoked"), "call after revoke: %s", ncclGetLastError(comm));
  CHECK(ncclCommFinalize(comm) == ncclInvalidUsage, "%s", "finalize after revoke");
  ncclComm_t child = NULL;
  NCCL_OK(ncclCommShrink(comm, NULL, 0, &child, NULL, NCCL_SHRINK_DEFAULT));
  CHECK(child != NULL, "%s", "no communicator shrunk from the revoked one");
  if (child) {
    v[0] = 2;
    NCCL_OK(ncclAllReduce(v, v, 1, ncclInt64, ncclSum, child, NULL));
    CHECK(v[0] == 2 * n, "allreduce on the shrunk communicator: %lld", (long long)v[0]);
    NCCL_OK(ncclCommDestroy(child));
  }
  NCCL_OK(ncclCommDestroy(comm));
}

/* The last rank joins the others' communicator through ncclCommGrow. */
static void scenario_grow(void) {
  int old = g_nranks - 1;
  ncclUniqueId id, gid;
  ncclComm_t comm = NULL, grown = NULL;
  if (g_rank < old) {
    if (share_id("id", &id) != 0) {
      CHECK(0, "%s", "no unique id");
      return;
    }
    NCCL_OK(ncclCommInitRank(&comm, old, id, g_rank));
    if (g_rank == 0) {
      NCCL_OK(ncclCommGetUniqueId(comm, &gid));
      CHECK(publish_id("grow", &gid) == 0, "%s", "publishing the grow id");
    }
    CHECK(ncclCommGrow(comm, g_nranks, NULL, 0, &grown, NULL) == ncclInvalidArgument && grown == NULL, "%s", "an existing rank asked for a rank");
    CHECK(ncclCommGrow(comm, old, NULL, -1, &grown, NULL) == ncclInvalidArgument && grown == NULL, "%s", "a grow to the same size");
    NCCL_OK(ncclCommGrow(comm, g_nranks, g_rank == 0 ? &gid : NULL, -1, &grown, NULL));
  } else {
    if (wait_id("grow", &gid) != 0) {
      CHECK(0, "%s", "no grow id");
      return;
    }
    CHECK(ncclCommGrow(NULL, g_nranks, NULL, g_rank, &grown, NULL) == ncclInvalidArgument, "%s", "a new rank without an id");
    NCCL_OK(ncclCommGrow(NULL, g_nranks, &gid, g_rank, &grown, NULL));
  }
  int cnt = 0, rk = -1;
  NCCL_OK(ncclCommCount(grown, &cnt));
  NCCL_OK(ncclCommUserRank(grown, &rk));
  CHECK(cnt == g_nranks && rk == g_rank, "grown count %d rank %d", cnt, rk);
  int64_t v = g_rank + 1;
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclInt64, ncclSum, grown, NULL));
  CHECK(v == (int64_t)g_nranks * (g_nranks + 1) / 2, "allreduce on the grown communicator: %lld", (long long)v);
  NCCL_OK(ncclCommDestroy(grown));
  if (comm) NCCL_OK(ncclCommDestroy(comm));
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s SCENARIO RANK NRANKS DIR\n", argv[0]);
    return 100;
  }
  g_rank = atoi(argv[2]);
  g_nranks = atoi(argv[3]);
  snprintf(g_dir, sizeof g_dir, "%s", argv[4]);
  const char *s = argv[1];
  if (!strcmp(s, "colls")) scenario_colls();
  else if (!strcmp(s, "selftest")) scenario_selftest();
  else if (!strcmp(s, "groups")) scenario_groups();
  else if (!strcmp(s, "split")) scenario_split();
  else if (!strcmp(s, "abort")) scenario_abort();
  else if (!strcmp(s, "abort_thread")) scenario_abort_thread();
  else if (!strcmp(s, "refused")) scenario_refused();
  else if (!strcmp(s, "group_refused")) scenario_group_refused();
  else if (!strcmp(s, "nonblocking")) scenario_nonblocking();
  else if (!strcmp(s, "nonblocking_split")) scenario_nonblocking_split();
  else if (!strcmp(s, "streams")) scenario_streams();
  else if (!strcmp(s, "configs")) scenario_configs();
  else if (!strcmp(s, "badargs")) scenario_badargs();
  else if (!strcmp(s, "commid")) scenario_commid();
  else if (!strcmp(s, "shrink_dead")) scenario_shrink_dead();
  else if (!strcmp(s, "scalable")) scenario_scalable();
  else if (!strcmp(s, "shrink_threads")) scenario_shrink_threads();
  else if (!strcmp(s, "newer")) scenario_newer();
  else if (!strcmp(s, "grow")) scenario_grow();
  else if (!strcmp(s, "windows")) scenario_windows();
  else {
    fprintf(stderr, "unknown scenario %s\n", s);
    return 100;
  }
  if (failures) fprintf(stderr, "rank %d: %s: %d checks failed\n", g_rank, s, failures);
  else printf("rank %d: %s: ok\n", g_rank, s);
  return failures > 99 ? 99 : failures;
}
