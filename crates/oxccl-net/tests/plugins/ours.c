/* A network plugin of oxccl's own for its tests: TCP over 127.0.0.1, one
 * socket per connection, every call non-blocking. It speaks the plugin
 * ABI of one table version, chosen when it is built:
 *
 *   -DNET_VERSION=8 .. 12   export ncclNetPlugin_v<N> (one version);
 *   -DALL_VERSIONS          export v8 through v11 (the host takes the newest);
 *   -DFAIL_INIT             init logs a warning and fails (ncclSystemError);
 *   -DONLY_V99              export only ncclNetPlugin_v99 (no known version);
 *   -DDROP_AFTER=<bytes>    a send connection shuts its socket once it has
 *                           sent that many bytes (a connection lost mid-run);
 *   -DLATENCY_US=<us>       the latency the device states (default 3.5).
 *
 * The structures below are written for these tests from the published
 * layout of the plugin ABI (field order and C types), nothing more.
 * Connect and accept answer "not yet" (a null comm) at least once, so the
 * host's retry loop is exercised; a comm takes at most 32 requests and
 * answers a null request beyond that. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef NET_VERSION
#define NET_VERSION 10
#endif
#ifndef LATENCY_US
#define LATENCY_US 3.5f
#endif

typedef int res_t;
enum { OK = 0, SYSTEM_ERROR = 2, INTERNAL_ERROR = 3, INVALID_USAGE = 5, REMOTE_ERROR = 6 };
enum { LOG_WARN = 2, LOG_INFO = 3 };
enum { SUBSYS_NET = 16 };
enum { PTR_HOST = 1 };
typedef void (*logger_t)(int level, unsigned long flags, const char *file, int line,
                         const char *fmt, ...);
typedef res_t (*profiler_t)(void **, int, void *, int64_t, void *);

static logger_t logf_;
#define LOG(level, ...)                                                                  \
    do {                                                                                 \
        if (logf_) logf_(level, SUBSYS_NET, __FILE__, __LINE__, __VA_ARGS__);             \
    } while (0)

#define MAGIC 0x6f757273u /* "ours" */
#define MAX_REQS 32

/* The listen handle: where to connect, and the connector's progress. */
struct handle {
    uint32_t magic;
    uint16_t port;
    uint16_t stage; /* 0: not started, 1: connecting */
    int fd;
};

struct listen_comm {
    int fd;
    int polls; /* accept answers "not yet" on its first call */
};

struct req {
    struct comm *comm;
    int used, sending, complete, failed;
    char *data;
    size_t size; /* to send, or the buffer's capacity */
    int tag;
    unsigned char hdr[16];
    size_t hdr_done, body_done, got;
};

struct comm {
    int fd, sending;
    size_t sent; /* bytes sent on this connection (for DROP_AFTER) */
    struct req reqs[MAX_REQS];
    int queue[MAX_REQS]; /* indices into reqs, oldest first */
    int head, n;
};

struct mr {
    void *data;
    size_t size;
};

static res_t ours_init(void) {
    LOG(LOG_INFO, "ours: plugin init (table v%d)", NET_VERSION);
#ifdef FAIL_INIT
    LOG(LOG_WARN, "ours: refusing to initialise (built with FAIL_INIT)");
    return SYSTEM_ERROR;
#endif
    return OK;
}

static res_t ours_devices(int *n) {
    *n = 1;
    return OK;
}

static int nonblocking(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

static res_t ours_listen(int dev, void *opaque, void **listen_comm) {
    (void)dev;
    struct handle *h = opaque;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return SYSTEM_ERROR;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 128) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        close(fd);
        return SYSTEM_ERROR;
    }
    memset(h, 0, sizeof *h);
    h->magic = MAGIC;
    h->port = ntohs(a.sin_port);
    h->fd = -1;
    struct listen_comm *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return SYSTEM_ERROR;
    }
    l->fd = fd;
    *listen_comm = l;
    return OK;
}

static struct comm *new_comm(int fd, int sending) {
    struct comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    c->sending = sending;
    nonblocking(fd);
    return c;
}

static res_t ours_connect(int dev, void *opaque, void **send_comm) {
    (void)dev;
    struct handle *h = opaque;
    *send_comm = NULL;
    if (h->magic != MAGIC) {
        LOG(LOG_WARN, "ours: connect to a handle that is not ours (magic %x)", h->magic);
        return INVALID_USAGE;
    }
    if (h->stage == 0) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return SYSTEM_ERROR;
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(h->port);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) {
            close(fd);
            return SYSTEM_ERROR;
        }
        h->fd = fd;
        h->stage = 1;
        return OK; /* not yet: the caller comes back with the same handle */
    }
    struct pollfd p = {h->fd, POLLOUT, 0};
    if (poll(&p, 1, 0) == 0) return OK;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
        LOG(LOG_WARN, "ours: connect to port %d failed: %s", h->port, strerror(err));
        return SYSTEM_ERROR;
    }
    struct comm *c = new_comm(h->fd, 1);
    if (!c) return SYSTEM_ERROR;
    h->stage = 2;
    *send_comm = c;
    LOG(LOG_INFO, "ours: connected to 127.0.0.1:%d", h->port);
    return OK;
}

static res_t ours_accept(void *listen_comm, void **recv_comm) {
    struct listen_comm *l = listen_comm;
    *recv_comm = NULL;
    if (l->polls++ == 0) return OK;
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? OK : SYSTEM_ERROR;
    struct comm *c = new_comm(fd, 0);
    if (!c) {
        close(fd);
        return SYSTEM_ERROR;
    }
    *recv_comm = c;
    return OK;
}

static res_t ours_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    (void)comm;
    if (type != PTR_HOST) {
        LOG(LOG_WARN, "ours: only host memory can be registered (type %d)", type);
        return INTERNAL_ERROR;
    }
    struct mr *m = malloc(sizeof *m);
    if (!m) return SYSTEM_ERROR;
    m->data = data;
    m->size = size;
    *mhandle = m;
    return OK;
}

static res_t ours_dereg_mr(void *comm, void *mhandle) {
    (void)comm;
    free(mhandle);
    return OK;
}

/* A new request on `c`, or NULL when it already has MAX_REQS. */
static struct req *post(struct comm *c, int sending, void *data, size_t size, int tag) {
    if (c->n == MAX_REQS) return NULL;
    for (int i = 0; i < MAX_REQS; i++) {
        struct req *r = &c->reqs[i];
        if (r->used) continue;
        memset(r, 0, sizeof *r);
        r->used = 1;
        r->comm = c;
        r->sending = sending;
        r->data = data;
        r->size = size;
        r->tag = tag;
        if (sending) {
            uint64_t n = size;
            uint32_t t = (uint32_t)tag;
            memcpy(r->hdr, &t, 4);
            memcpy(r->hdr + 8, &n, 8);
        }
        c->queue[(c->head + c->n) % MAX_REQS] = i;
        c->n++;
        return r;
    }
    return NULL;
}

static res_t ours_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                        void **request) {
    struct mr *m = mhandle;
    if (!m || (char *)data < (char *)m->data ||
        (char *)data + size > (char *)m->data + m->size) {
        LOG(LOG_WARN, "ours: isend of %zu bytes outside its registration", size);
        return INVALID_USAGE;
    }
    *request = post(send_comm, 1, data, size, tag);
    return OK;
}

static res_t ours_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                        void **mhandles, void **request) {
    (void)mhandles;
    if (n != 1) {
        LOG(LOG_WARN, "ours: irecv of %d buffers (maxRecvs is 1)", n);
        return INVALID_USAGE;
    }
    *request = post(recv_comm, 0, data[0], sizes[0], tags[0]);
    return OK;
}

/* Moves bytes: `buf[*done..want]` out or in; 1 when complete, 0 when the
 * socket would block, -1 on error or close. */
static int move(struct comm *c, char *buf, size_t want, size_t *done) {
    while (*done < want) {
        ssize_t k;
        size_t chunk = want - *done;
        if (c->sending) {
#ifdef DROP_AFTER
            if (c->sent + chunk > (size_t)(DROP_AFTER)) {
                LOG(LOG_WARN, "ours: dropping the connection after %zu bytes (built with DROP_AFTER)",
                    c->sent);
                shutdown(c->fd, SHUT_RDWR);
                return -1;
            }
#endif
            k = send(c->fd, buf + *done, chunk, MSG_DONTWAIT | MSG_NOSIGNAL);
        } else {
            k = recv(c->fd, buf + *done, chunk, MSG_DONTWAIT);
        }
        if (k > 0) {
            *done += (size_t)k;
            if (c->sending) c->sent += (size_t)k;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
        return -1;
    }
    return 1;
}

/* Progresses `c`'s requests in order until one would block. */
static void progress(struct comm *c) {
    while (c->n > 0) {
        struct req *r = &c->reqs[c->queue[c->head]];
        int st = move(c, (char *)r->hdr, 16, &r->hdr_done);
        if (st == 1 && !r->sending && r->body_done == 0 && r->got == 0) {
            uint32_t t;
            uint64_t size;
            memcpy(&t, r->hdr, 4);
            memcpy(&size, r->hdr + 8, 8);
            if ((int)t != r->tag || size > r->size) {
                LOG(LOG_WARN, "ours: message of %llu bytes with tag %d for a receive of %zu with tag %d",
                    (unsigned long long)size, (int)t, r->size, r->tag);
                st = -1;
            } else {
                r->got = size;
                if (size == 0) r->body_done = 0;
            }
        }
        if (st == 1) {
            size_t want = r->sending ? r->size : r->got;
            st = move(c, r->data, want, &r->body_done);
        }
        if (st == 0) return;
        if (st < 0) {
            /* The connection is gone: this and every later request fail. */
            for (int i = 0; i < c->n; i++) c->reqs[c->queue[(c->head + i) % MAX_REQS]].failed = 1;
            c->n = 0;
            return;
        }
        r->complete = 1;
        c->head = (c->head + 1) % MAX_REQS;
        c->n--;
    }
}

static res_t ours_test(void *request, int *done, int *size) {
    struct req *r = request;
    *done = 0;
    if (!r->complete && !r->failed) progress(r->comm);
    if (r->failed) {
        LOG(LOG_WARN, "ours: the connection failed under a %s", r->sending ? "send" : "receive");
        r->used = 0;
        return r->sending ? SYSTEM_ERROR : REMOTE_ERROR;
    }
    if (!r->complete) return OK;
    *done = 1;
    if (size) *size = (int)(r->sending ? r->size : r->got);
    r->used = 0;
    return OK;
}

static res_t ours_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                         void **request) {
    (void)recv_comm, (void)n, (void)data, (void)sizes, (void)mhandles;
    *request = NULL; /* host memory: nothing to flush */
    return OK;
}

static res_t ours_close(void *comm) {
    struct comm *c = comm;
    if (!c) return OK;
    close(c->fd);
    free(c);
    return OK;
}

static res_t ours_close_listen(void *listen_comm) {
    struct listen_comm *l = listen_comm;
    close(l->fd);
    free(l);
    return OK;
}

/* ---- properties and tables, per version ---- */

#define PROPS_HEAD                                                                        \
    char *name;                                                                          \
    char *pciPath;                                                                       \
    uint64_t guid;                                                                       \
    int ptrSupport;                                                                      \
    int regIsGlobal;

#define PROPS_MID                                                                         \
    int speed;                                                                           \
    int port;                                                                            \
    float latency;                                                                       \
    int maxComms;                                                                        \
    int maxRecvs;                                                                        \
    int netDeviceType;                                                                   \
    int netDeviceVersion;

#if NET_VERSION == 8
typedef struct { PROPS_HEAD PROPS_MID } props_t;
#elif NET_VERSION == 9 || NET_VERSION == 10
typedef struct { PROPS_HEAD int forceFlush; PROPS_MID struct { int ndevs; int devs[4]; } vProps;
                 size_t maxP2pBytes; size_t maxCollBytes; } props_t;
#elif NET_VERSION == 11
typedef struct { PROPS_HEAD int forceFlush; PROPS_MID struct { int ndevs; int devs[4]; } vProps;
                 size_t maxP2pBytes; size_t maxCollBytes; int maxMultiRequestSize; } props_t;
#else
typedef struct { PROPS_HEAD int forceFlush; PROPS_MID struct { int ndevs; int devs[8]; } vProps;
                 size_t maxP2pBytes; size_t maxCollBytes; int maxMultiRequestSize;
                 int16_t railId; int16_t planeId; } props_t;
#endif

static res_t ours_props(int dev, props_t *p) {
    if (dev != 0) return INVALID_USAGE;
    memset(p, 0, sizeof *p);
    p->name = "ours0";
    p->pciPath = NULL;
    p->guid = 0x6f757273;
    p->ptrSupport = PTR_HOST;
    p->speed = 25000;
    p->latency = LATENCY_US;
    p->maxComms = 65536;
    p->maxRecvs = 1;
#if NET_VERSION >= 9
    p->vProps.ndevs = 1;
    p->maxP2pBytes = (size_t)1 << 30;
    p->maxCollBytes = (size_t)1 << 30;
#endif
    return OK;
}

/* The entries after `accept` are alike in every version but for the
 * sizes of isend/irecv. */
static res_t ours_reg_dmabuf(void *c, void *d, size_t s, int t, uint64_t o, int fd, void **m) {
    (void)c, (void)d, (void)s, (void)t, (void)o, (void)fd, (void)m;
    return INTERNAL_ERROR;
}

#if NET_VERSION == 8
static res_t v_init(logger_t l) { logf_ = l; return ours_init(); }
static res_t v_listen(int dev, void *h, void **l) { return ours_listen(dev, h, l); }
static res_t v_connect(int dev, void *h, void **s, void **dc) { (void)dc; return ours_connect(dev, h, s); }
static res_t v_isend(void *c, void *d, int size, int tag, void *m, void **r) {
    return ours_isend(c, d, (size_t)size, tag, m, r);
}
static res_t v_irecv(void *c, int n, void **d, int *sizes, int *tags, void **m, void **r) {
    size_t s = n == 1 ? (size_t)sizes[0] : 0;
    return ours_irecv(c, n, d, &s, tags, m, r);
}
#elif NET_VERSION == 9
static res_t v_init(logger_t l) { logf_ = l; return ours_init(); }
static res_t v_listen(int dev, void *h, void **l) { return ours_listen(dev, h, l); }
static res_t v_connect(int dev, void *h, void **s, void **dc) { (void)dc; return ours_connect(dev, h, s); }
static res_t v_isend(void *c, void *d, size_t size, int tag, void *m, void **r) {
    return ours_isend(c, d, size, tag, m, r);
}
static res_t v_irecv(void *c, int n, void **d, size_t *sizes, int *tags, void **m, void **r) {
    return ours_irecv(c, n, d, sizes, tags, m, r);
}
#else
#if NET_VERSION == 10
static res_t v_init(logger_t l, profiler_t p) { (void)p; logf_ = l; return ours_init(); }
static res_t v_listen(int dev, void *h, void **l) { return ours_listen(dev, h, l); }
struct config { int trafficClass; };
static res_t v_connect(int dev, struct config *cfg, void *h, void **s, void **dc) {
    (void)cfg, (void)dc;
    return ours_connect(dev, h, s);
}
#else
static int context_marker;
static res_t v_init(void **ctx, uint64_t id, void *cfg, logger_t l, profiler_t p) {
    (void)id, (void)cfg, (void)p;
    logf_ = l;
    *ctx = &context_marker;
    return ours_init();
}
static res_t v_listen(void *ctx, int dev, void *h, void **l) {
    if (ctx != &context_marker) return INVALID_USAGE;
    return ours_listen(dev, h, l);
}
static res_t v_connect(void *ctx, int dev, void *h, void **s, void **dc) {
    (void)dc;
    if (ctx != &context_marker) return INVALID_USAGE;
    return ours_connect(dev, h, s);
}
static res_t v_finalize(void *ctx) { return ctx == &context_marker ? OK : INVALID_USAGE; }
#endif
static res_t v_isend(void *c, void *d, size_t size, int tag, void *m, void *ph, void **r) {
    (void)ph;
    return ours_isend(c, d, size, tag, m, r);
}
static res_t v_irecv(void *c, int n, void **d, size_t *sizes, int *tags, void **m, void **ph,
                     void **r) {
    (void)ph;
    return ours_irecv(c, n, d, sizes, tags, m, r);
}
#endif

static res_t v_accept(void *l, void **r, void **dc) { (void)dc; return ours_accept(l, r); }

struct table {
    const char *name;
    void *init, *devices, *getProperties, *listen, *connect, *accept, *regMr, *regMrDmaBuf,
        *deregMr, *isend, *irecv, *iflush, *test, *closeSend, *closeRecv, *closeListen,
        *getDeviceMr, *irecvConsumed;
#if NET_VERSION >= 9
    void *makeVDevice;
#endif
#if NET_VERSION >= 11
    void *finalize, *setNetAttr;
#endif
};

#define TABLE                                                                             \
    {                                                                                    \
        "ours", (void *)v_init, (void *)ours_devices, (void *)ours_props,                \
            (void *)v_listen, (void *)v_connect, (void *)v_accept, (void *)ours_reg_mr,  \
            (void *)ours_reg_dmabuf, (void *)ours_dereg_mr, (void *)v_isend,             \
            (void *)v_irecv, (void *)ours_iflush, (void *)ours_test, (void *)ours_close, \
            (void *)ours_close, (void *)ours_close_listen, NULL, NULL TAIL               \
    }
#if NET_VERSION >= 11
#define TAIL , NULL, (void *)v_finalize, NULL
#elif NET_VERSION >= 9
#define TAIL , NULL
#else
#define TAIL
#endif

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

#if defined(ONLY_V99)
const struct table ncclNetPlugin_v99 = TABLE;
#elif defined(ALL_VERSIONS)
/* The table of NET_VERSION under every name from v8 to v11: the host must
 * take the newest (v11), and it is built with NET_VERSION=11. */
const struct table ncclNetPlugin_v8 = TABLE;
const struct table ncclNetPlugin_v9 = TABLE;
const struct table ncclNetPlugin_v10 = TABLE;
const struct table ncclNetPlugin_v11 = TABLE;
#else
const struct table CAT(ncclNetPlugin_v, NET_VERSION) = TABLE;
#endif
