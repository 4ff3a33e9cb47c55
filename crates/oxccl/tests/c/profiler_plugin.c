/* A profiler plugin for the tests: exports ncclProfiler_v5 (or, built with
 * -DPLUGIN_V4, ncclProfiler_v4) and writes one line per call to the file
 * PROFILER_OUT names, tagged with the rank:
 *   <rank> init nranks=<n>
 *   <rank> start group <id> parent=<id>
 *   <rank> start coll <id> parent=<id> <func> seq=<n> count=<n> root=<r> <type> <algo> <proto> ch=<n>
 *   <rank> start p2p <id> parent=<id> <func> count=<n> peer=<p> <type>
 *   <rank> start proxyop <id> parent=<id> ownpid=<0|1> ch=<c> peer=<p> steps=<n> send=<0|1>
 *   <rank> start proxystep <id> parent=<id> step=<n>
 *   <rank> state <id> <state> bytes=<n>
 *   <rank> stop <id>
 *   <rank> finalize
 * Event ids count from 1 per process; parent 0 is none. The activation
 * mask is PROFILER_MASK's (a decimal), by default group, collective and
 * point-to-point (7). The types are
 * written from NCCL's documented plugin interface, not copied. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  uint64_t seq;
  const char *func;
  const void *send;
  void *recv;
  size_t count;
  int root;
  const char *datatype;
  uint8_t nChannels, nWarps;
  const char *algo, *proto;
  void *parentGroup;
} coll_t;

typedef struct {
  const char *func;
  void *buff;
  const char *datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
  void *parentGroup;
} p2p_t;

typedef struct {
  int pid;
  uint8_t channelId;
  int peer, nSteps, chunkSize, isSend;
} proxy_op_t;

typedef struct {
  int step;
} proxy_step_t;

typedef struct {
#ifdef PLUGIN_V4
  uint8_t type;
#else
  uint64_t type;
#endif
  void *parentObj;
  int rank;
  union {
    coll_t coll;
    p2p_t p2p;
    proxy_op_t proxyOp;
    proxy_step_t proxyStep;
  };
} descr_t;

typedef struct {
  int rank;
} ctx_t;

typedef struct {
  ctx_t *ctx;
  long id;
} event_t;

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long next_id;

static void line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void line(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(out, fmt, ap);
  va_end(ap);
  fflush(out);
}

typedef void (*logger_t)(int, unsigned long, const char *, int, const char *, ...);

static int init_common(void **context, int *mask, int nranks, int rank) {
  pthread_mutex_lock(&lock);
  if (!out) {
    const char *p = getenv("PROFILER_OUT");
    out = p ? fopen(p, "w") : NULL;
  }
  if (!out) {
    pthread_mutex_unlock(&lock);
    return 1;
  }
  ctx_t *c = calloc(1, sizeof *c);
  c->rank = rank;
  *context = c;
  const char *m = getenv("PROFILER_MASK");
  *mask = m ? atoi(m) : (1 | 2 | 4); /* group, collective, point-to-point */
  line("%d init nranks=%d\n", rank, nranks);
  pthread_mutex_unlock(&lock);
  return 0;
}

#ifdef PLUGIN_V4
static int init(void **context, int *mask, const char *name, uint64_t hash, int nnodes, int nranks,
                int rank, logger_t log) {
  (void)name, (void)hash, (void)nnodes;
  log(3, 0, __FILE__, __LINE__, "test plugin v4 up");
  return init_common(context, mask, nranks, rank);
}
#else
static int init(void **context, uint64_t id, int *mask, const char *name, int nnodes, int nranks,
                int rank, logger_t log) {
  (void)name, (void)id, (void)nnodes;
  log(3, 0, __FILE__, __LINE__, "test plugin v5 up");
  return init_common(context, mask, nranks, rank);
}
#endif

static long id_of(void *h) { return h ? ((event_t *)h)->id : 0; }

static int start(void *context, void **handle, descr_t *d) {
  ctx_t *c = context;
  pthread_mutex_lock(&lock);
  event_t *e = calloc(1, sizeof *e);
  e->ctx = c;
  e->id = ++next_id;
  *handle = e;
  if (d->rank != c->rank) line("%d bad rank %d\n", c->rank, d->rank);
  switch (d->type) {
  case 1:
    line("%d start group %ld parent=%ld\n", c->rank, e->id, id_of(d->parentObj));
    break;
  case 2:
    line("%d start coll %ld parent=%ld %s seq=%llu count=%zu root=%d %s %s %s ch=%d\n", c->rank, e->id,
         id_of(d->parentObj), d->coll.func, (unsigned long long)d->coll.seq, d->coll.count,
         d->coll.root, d->coll.datatype, d->coll.algo, d->coll.proto, d->coll.nChannels);
    break;
  case 4:
    line("%d start p2p %ld parent=%ld %s count=%zu peer=%d %s\n", c->rank, e->id, id_of(d->parentObj),
         d->p2p.func, d->p2p.count, d->p2p.peer, d->p2p.datatype);
    break;
  case 8:
    line("%d start proxyop %ld parent=%ld ownpid=%d ch=%d peer=%d steps=%d send=%d\n", c->rank, e->id,
         id_of(d->parentObj), d->proxyOp.pid == (int)getpid(), d->proxyOp.channelId, d->proxyOp.peer,
         d->proxyOp.nSteps, d->proxyOp.isSend);
    break;
  case 16:
    line("%d start proxystep %ld parent=%ld step=%d\n", c->rank, e->id, id_of(d->parentObj),
         d->proxyStep.step);
    break;
  default:
    line("%d start unasked type %llu\n", c->rank, (unsigned long long)d->type);
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

static int stop(void *handle) {
  event_t *e = handle;
  pthread_mutex_lock(&lock);
  line("%d stop %ld\n", e->ctx->rank, e->id);
  pthread_mutex_unlock(&lock);
  free(e);
  return 0;
}

static int record(void *handle, int state, void *args) {
  event_t *e = handle;
  pthread_mutex_lock(&lock);
  line("%d state %ld %d bytes=%zu\n", e->ctx->rank, e->id, state, args ? *(size_t *)args : (size_t)0);
  pthread_mutex_unlock(&lock);
  return 0;
}

static int finalize(void *context) {
  ctx_t *c = context;
  pthread_mutex_lock(&lock);
  line("%d finalize\n", c->rank);
  pthread_mutex_unlock(&lock);
  free(c);
  return 0;
}

typedef struct {
  const char *name;
  void *init, *start, *stop, *record, *finalize;
} plugin_t;

#ifdef PLUGIN_V4
plugin_t ncclProfiler_v4 = {"oxccl-test-v4", (void *)init, (void *)start, (void *)stop, (void *)record, (void *)finalize};
#else
plugin_t ncclProfiler_v5 = {"oxccl-test-v5", (void *)init, (void *)start, (void *)stop, (void *)record, (void *)finalize};
#endif
