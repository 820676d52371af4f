/*
 * fault transport wrapper (see fault.h). Each wrapped ep keeps the inner
 * transport's ops and ep, and one thread that owns a list of timers
 * sorted by due time: delayed requests (PASS, handed to the inner ep when
 * due) and dropped ones (FAIL, completed with KVF_ERR_TIMEOUT when the
 * engine timeout expires). Requests handed to the inner ep travel as a
 * shadow copy whose completion the wrapper intercepts, so that a reset
 * can turn the completion of everything in flight into
 * KVF_ERR_CONN_RESET. The inner ep is only replaced (close + reopen) under
 * the write side of `inner_lock`; posts hold the read side, and closing
 * the inner ep waits for its requests, so no late write into a buffer of
 * a request already reported failed can happen.
 */
#include "transport/fault/fault.h"
#include "core/alloc.h"
#include "core/rng.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const kvf_config_entry_t kvf_fault_config_entries[] = {
    {"fault", "",
     "inject transport faults: seed=S,delay_ms=N,jitter_ms=N,drop=P,"
     "fail_after=N,reset_after=N (empty = off)",
     KVF_CONFIG_DEBUG},
};

KVF_CONFIG_TABLE(kvf_fault_config, "fault", kvf_fault_config_entries)

typedef struct kvf_fault_req {
    kvf_tl_req_t req;   /* the shadow handed to the inner ep */
    kvf_tl_req_t *orig; /* the poster's request */
    struct kvf_tl_ep *ep;
    uint64_t gen; /* reset generation when queued / passed */
    uint64_t due_ms;
    kvf_status_t fail; /* KVF_OK: pass when due; else fail with it */
    struct kvf_fault_req *next;
} kvf_fault_req_t;

struct kvf_tl_ep {
    const kvf_transport_ops_t *inner_ops;
    kvf_tl_ep_t *inner; /* NULL after a failed reopen */
    kvf_tl_iface_t *iface;
    char address[KVF_HOST_MAX + 16];
    kvf_fault_spec_t spec;
    uint64_t ep_index;
    unsigned timeout_ms;
    pthread_rwlock_t inner_lock;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    int stop;
    uint64_t nposted;
    uint64_t gen;
    int reset_pending;
    kvf_fault_req_t *timers; /* sorted by due_ms */
    unsigned queued_pass;    /* PASS timers in the list */
};

static kvf_fault_stats_t kvf_fault_totals;
static uint64_t kvf_fault_neps;

#define KVF_FAULT_COUNT(_f)                                                    \
    __atomic_add_fetch(&kvf_fault_totals._f, 1, __ATOMIC_RELAXED)

void kvf_fault_stats(kvf_fault_stats_t *s)
{
    s->posted = __atomic_load_n(&kvf_fault_totals.posted, __ATOMIC_RELAXED);
    s->passed = __atomic_load_n(&kvf_fault_totals.passed, __ATOMIC_RELAXED);
    s->delayed = __atomic_load_n(&kvf_fault_totals.delayed, __ATOMIC_RELAXED);
    s->dropped = __atomic_load_n(&kvf_fault_totals.dropped, __ATOMIC_RELAXED);
    s->failed = __atomic_load_n(&kvf_fault_totals.failed, __ATOMIC_RELAXED);
    s->resets = __atomic_load_n(&kvf_fault_totals.resets, __ATOMIC_RELAXED);
    s->reset_failed =
        __atomic_load_n(&kvf_fault_totals.reset_failed, __ATOMIC_RELAXED);
}

static kvf_status_t kvf_fault_parse_u64(const char *key, const char *v,
                                        uint64_t *out)
{
    char *end;
    unsigned long long x;

    errno = 0;
    x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || *v == '-') {
        kvf_error("fault spec: %s=%s is not a non-negative integer", key, v);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = x;
    return KVF_OK;
}

kvf_status_t kvf_fault_parse(const char *text, kvf_fault_spec_t *spec,
                             int *active_p)
{
    char buf[256], *tok, *save, *eq, *end;
    kvf_status_t status = KVF_OK;
    uint64_t v;

    memset(spec, 0, sizeof(*spec));
    spec->seed = 1;
    *active_p = 0;
    if (text == NULL || *text == '\0' || strcmp(text, "off") == 0) {
        return KVF_OK;
    }
    if (strlen(text) >= sizeof(buf)) {
        kvf_error("fault spec longer than %zu characters", sizeof(buf) - 1);
        return KVF_ERR_INVALID_PARAM;
    }
    snprintf(buf, sizeof(buf), "%s", text);
    for (tok = strtok_r(buf, ",", &save); tok != NULL && status == KVF_OK;
         tok = strtok_r(NULL, ",", &save)) {
        eq = strchr(tok, '=');
        if (eq == NULL) {
            kvf_error("fault spec: '%s' is not key=value", tok);
            return KVF_ERR_INVALID_PARAM;
        }
        *eq++ = '\0';
        if (strcmp(tok, "drop") == 0) {
            errno = 0;
            spec->drop = strtod(eq, &end);
            if (errno != 0 || end == eq || *end != '\0' ||
                !(spec->drop >= 0.0 && spec->drop <= 1.0)) {
                kvf_error("fault spec: drop=%s is not in 0..1", eq);
                return KVF_ERR_INVALID_PARAM;
            }
            continue;
        }
        status = kvf_fault_parse_u64(tok, eq, &v);
        if (status != KVF_OK) {
            break;
        }
        if (strcmp(tok, "seed") == 0) {
            spec->seed = v;
        } else if (strcmp(tok, "delay_ms") == 0 && v <= 600000) {
            spec->delay_ms = (unsigned)v;
        } else if (strcmp(tok, "jitter_ms") == 0 && v <= 600000) {
            spec->jitter_ms = (unsigned)v;
        } else if (strcmp(tok, "fail_after") == 0) {
            spec->fail_after = v;
        } else if (strcmp(tok, "reset_after") == 0) {
            spec->reset_after = v;
        } else {
            kvf_error("fault spec: unknown key or value out of range: "
                      "%s=%s (keys: seed, delay_ms, jitter_ms, drop, "
                      "fail_after, reset_after)",
                      tok, eq);
            status = KVF_ERR_INVALID_PARAM;
        }
    }
    if (status == KVF_OK) {
        *active_p = 1;
    }
    return status;
}

/* Uniform in [0, 1) for request k of this ep: depends on (seed, ep, k). */
static double kvf_fault_uniform(const kvf_tl_ep_t *ep, uint64_t k,
                                uint64_t salt)
{
    kvf_rng_t r;

    kvf_rng_seed(&r, ep->spec.seed ^ (ep->ep_index * 0x9e3779b97f4a7c15ull) ^
                         (k * 0xbf58476d1ce4e5b9ull) ^ salt);
    return (double)(kvf_rng_next(&r) >> 11) / 9007199254740992.0;
}

/* Completes the poster's request from the inner completion of a shadow. */
static void kvf_fault_inner_complete(kvf_tl_req_t *req)
{
    kvf_fault_req_t *f = req->arg;
    kvf_tl_req_t *orig = f->orig;
    kvf_tl_ep_t *ep = f->ep;
    kvf_status_t status = req->status; /* req lives in f */
    int stale;

    pthread_mutex_lock(&ep->lock);
    stale = (f->gen != ep->gen);
    pthread_mutex_unlock(&ep->lock);
    kvf_free(f);
    if (stale) {
        KVF_FAULT_COUNT(reset_failed);
        kvf_tl_req_fail(orig, KVF_ERR_CONN_RESET);
        return;
    }
    orig->status = status;
    orig->complete(orig);
}

/* Hands a shadow to the inner ep (or fails it if there is none). */
static void kvf_fault_pass(kvf_fault_req_t *f)
{
    kvf_tl_ep_t *ep = f->ep;
    kvf_tl_req_t *orig = f->orig;
    kvf_status_t status;

    memset(&f->req, 0, sizeof(f->req));
    f->req.type = orig->type;
    f->req.segs = orig->segs;
    f->req.nsegs = orig->nsegs;
    f->req.bytes = orig->bytes;
    f->req.cancel = orig->cancel;
    f->req.local_mem = orig->local_mem;
    f->req.seg_status = orig->seg_status;
    f->req.complete = kvf_fault_inner_complete;
    f->req.arg = f;
    pthread_rwlock_rdlock(&ep->inner_lock);
    if (ep->inner == NULL) {
        status = KVF_ERR_PEER_UNREACHABLE;
    } else {
        KVF_FAULT_COUNT(passed);
        status = ep->inner_ops->ep_post(ep->inner, &f->req);
    }
    pthread_rwlock_unlock(&ep->inner_lock);
    if (status != KVF_OK) {
        kvf_free(f);
        kvf_tl_req_fail(orig, status);
    }
}

/* Inserts a timer in due order (stable for equal times). Holds lock. */
static void kvf_fault_timer_add(kvf_tl_ep_t *ep, kvf_fault_req_t *f)
{
    kvf_fault_req_t **pp = &ep->timers;

    while (*pp != NULL && (*pp)->due_ms <= f->due_ms) {
        pp = &(*pp)->next;
    }
    f->next = *pp;
    *pp = f;
    if (f->fail == KVF_OK) {
        ep->queued_pass++;
    }
    pthread_cond_signal(&ep->cond);
}

/* Closes and reopens the inner ep; everything in flight completes with
 * KVF_ERR_CONN_RESET (the generation moved on when the reset fired). */
static void kvf_fault_do_reset(kvf_tl_ep_t *ep)
{
    kvf_status_t status;

    pthread_rwlock_wrlock(&ep->inner_lock);
    if (ep->inner != NULL) {
        ep->inner_ops->ep_close(ep->inner);
        ep->inner = NULL;
    }
    status = ep->inner_ops->ep_open(ep->iface, ep->address, &ep->inner);
    if (status != KVF_OK) {
        ep->inner = NULL;
        kvf_warn("fault: reopening %s after an injected reset failed: %s",
                 ep->address, kvf_status_str(status));
    }
    pthread_rwlock_unlock(&ep->inner_lock);
}

static void *kvf_fault_main(void *arg)
{
    kvf_tl_ep_t *ep = arg;
    kvf_fault_req_t *f;
    struct timespec ts;
    uint64_t now;
    int wait_ms;

    pthread_mutex_lock(&ep->lock);
    while (!ep->stop) {
        if (ep->reset_pending) {
            ep->reset_pending = 0;
            pthread_mutex_unlock(&ep->lock);
            kvf_fault_do_reset(ep);
            pthread_mutex_lock(&ep->lock);
            continue;
        }
        now = kvf_time_ms();
        if (ep->timers != NULL && ep->timers->due_ms <= now) {
            f = ep->timers;
            ep->timers = f->next;
            if (f->fail == KVF_OK) {
                ep->queued_pass--;
            }
            if (f->fail == KVF_OK && f->gen != ep->gen) {
                f->fail = KVF_ERR_CONN_RESET;
                KVF_FAULT_COUNT(reset_failed);
            }
            pthread_mutex_unlock(&ep->lock);
            if (f->fail != KVF_OK) {
                kvf_tl_req_fail(f->orig, f->fail);
                kvf_free(f);
            } else {
                kvf_fault_pass(f);
            }
            pthread_mutex_lock(&ep->lock);
            continue;
        }
        wait_ms = 200;
        if (ep->timers != NULL && ep->timers->due_ms - now < 200) {
            wait_ms = (int)(ep->timers->due_ms - now);
        }
        kvf_time_abs_after(&ts, wait_ms);
        pthread_cond_timedwait(&ep->cond, &ep->lock, &ts);
    }
    pthread_mutex_unlock(&ep->lock);
    return NULL;
}

static kvf_status_t kvf_fault_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    kvf_fault_req_t *f;
    uint64_t k, delay;
    kvf_status_t status = KVF_OK;
    int direct = 0;

    f = kvf_malloc(sizeof(*f));
    if (f == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    f->orig = req;
    f->ep = ep;
    f->fail = KVF_OK;
    pthread_mutex_lock(&ep->lock);
    k = ++ep->nposted;
    KVF_FAULT_COUNT(posted);
    f->gen = ep->gen;
    if (ep->stop) {
        status = KVF_ERR_PEER_CLOSED;
    } else if (ep->spec.fail_after != 0 && k > ep->spec.fail_after) {
        KVF_FAULT_COUNT(failed);
        status = KVF_ERR_IO;
    } else if (ep->spec.reset_after != 0 && k % ep->spec.reset_after == 0) {
        KVF_FAULT_COUNT(resets);
        KVF_FAULT_COUNT(reset_failed);
        ep->gen++;
        ep->reset_pending = 1;
        pthread_cond_signal(&ep->cond);
        status = KVF_ERR_CONN_RESET;
    } else if (ep->spec.drop > 0.0 &&
               kvf_fault_uniform(ep, k, 0) < ep->spec.drop) {
        KVF_FAULT_COUNT(dropped);
        f->fail = KVF_ERR_TIMEOUT;
        f->due_ms = kvf_time_ms() + ep->timeout_ms;
        kvf_fault_timer_add(ep, f);
    } else if (ep->spec.delay_ms > 0 || ep->spec.jitter_ms > 0 ||
               ep->reset_pending || ep->queued_pass > 0) {
        delay = ep->spec.delay_ms;
        if (ep->spec.jitter_ms > 0) {
            delay += (uint64_t)(kvf_fault_uniform(ep, k, 1) *
                                (ep->spec.jitter_ms + 1));
        }
        if (delay > 0) {
            KVF_FAULT_COUNT(delayed);
        }
        f->due_ms = kvf_time_ms() + delay;
        kvf_fault_timer_add(ep, f);
    } else {
        direct = 1;
    }
    pthread_mutex_unlock(&ep->lock);
    if (status != KVF_OK) {
        kvf_log_rl(KVF_LOG_INFO, "fault: request %lu to %s: injected %s",
                   (unsigned long)k, ep->address, kvf_status_name(status));
        kvf_free(f);
        return status;
    }
    if (direct) {
        kvf_fault_pass(f);
    }
    return KVF_OK;
}

/* Side channels (checksum, link test) see the delay and fail_after. */
static kvf_status_t kvf_fault_side_gate(kvf_tl_ep_t *ep)
{
    int failed;

    pthread_mutex_lock(&ep->lock);
    failed = (ep->spec.fail_after != 0 && ep->nposted >= ep->spec.fail_after);
    pthread_mutex_unlock(&ep->lock);
    if (failed) {
        return KVF_ERR_IO;
    }
    if (ep->spec.delay_ms > 0) {
        usleep(ep->spec.delay_ms * 1000u);
    }
    return KVF_OK;
}

static kvf_status_t kvf_fault_ep_checksum(kvf_tl_ep_t *ep,
                                          const uint64_t *remote,
                                          const size_t *lengths, size_t count,
                                          uint64_t *sums)
{
    kvf_status_t status = kvf_fault_side_gate(ep);

    if (status != KVF_OK) {
        return status;
    }
    pthread_rwlock_rdlock(&ep->inner_lock);
    if (ep->inner == NULL) {
        status = KVF_ERR_PEER_UNREACHABLE;
    } else if (ep->inner_ops->ep_checksum == NULL) {
        status = KVF_ERR_UNSUPPORTED;
    } else {
        status =
            ep->inner_ops->ep_checksum(ep->inner, remote, lengths, count, sums);
    }
    pthread_rwlock_unlock(&ep->inner_lock);
    return status;
}

static kvf_status_t kvf_fault_ep_link_test(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                           void *local, uint64_t remote,
                                           size_t length, double *seconds_p)
{
    kvf_status_t status = kvf_fault_side_gate(ep);

    if (status != KVF_OK) {
        return status;
    }
    pthread_rwlock_rdlock(&ep->inner_lock);
    if (ep->inner == NULL) {
        status = KVF_ERR_PEER_UNREACHABLE;
    } else if (ep->inner_ops->ep_link_test == NULL) {
        status = KVF_ERR_UNSUPPORTED;
    } else {
        status = ep->inner_ops->ep_link_test(ep->inner, type, local, remote,
                                             length, seconds_p);
    }
    pthread_rwlock_unlock(&ep->inner_lock);
    return status;
}

static void kvf_fault_ep_close(kvf_tl_ep_t *ep)
{
    kvf_fault_req_t *f;

    pthread_mutex_lock(&ep->lock);
    ep->stop = 1;
    pthread_cond_signal(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
    pthread_join(ep->thread, NULL);
    /* timers left: delayed requests never started, drops never answered */
    while ((f = ep->timers) != NULL) {
        ep->timers = f->next;
        kvf_tl_req_fail(f->orig,
                        f->fail == KVF_OK ? KVF_ERR_CANCELED : f->fail);
        kvf_free(f);
    }
    pthread_rwlock_wrlock(&ep->inner_lock);
    if (ep->inner != NULL) {
        ep->inner_ops->ep_close(ep->inner);
        ep->inner = NULL;
    }
    pthread_rwlock_unlock(&ep->inner_lock);
    pthread_rwlock_destroy(&ep->inner_lock);
    pthread_mutex_destroy(&ep->lock);
    pthread_cond_destroy(&ep->cond);
    kvf_free(ep);
}

static int kvf_fault_available(void)
{
    return 0; /* a wrapper, never chosen as a transport of its own */
}

static const kvf_transport_ops_t kvf_fault_ops = {
    .name = "fault",
    .available = kvf_fault_available,
    .ep_close = kvf_fault_ep_close,
    .ep_post = kvf_fault_ep_post,
    .ep_checksum = kvf_fault_ep_checksum,
    .ep_link_test = kvf_fault_ep_link_test,
};

kvf_status_t kvf_fault_wrap(const kvf_fault_spec_t *spec, unsigned timeout_ms,
                            kvf_tl_iface_t *iface, const char *address,
                            const kvf_transport_ops_t **ops_p,
                            kvf_tl_ep_t **ep_p)
{
    pthread_rwlockattr_t attr;
    kvf_tl_ep_t *ep;

    if (spec == NULL || ops_p == NULL || ep_p == NULL || *ops_p == NULL ||
        *ep_p == NULL || address == NULL || timeout_ms == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    ep = kvf_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    ep->inner_ops = *ops_p;
    ep->inner = *ep_p;
    ep->iface = iface;
    snprintf(ep->address, sizeof(ep->address), "%s", address);
    ep->spec = *spec;
    ep->timeout_ms = timeout_ms;
    ep->ep_index = __atomic_fetch_add(&kvf_fault_neps, 1, __ATOMIC_RELAXED);
    pthread_rwlockattr_init(&attr);
    /* a reset must not wait behind an endless stream of posts */
    pthread_rwlockattr_setkind_np(&attr,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&ep->inner_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&ep->lock, NULL);
    kvf_cond_init(&ep->cond);
    if (pthread_create(&ep->thread, NULL, kvf_fault_main, ep) != 0) {
        pthread_rwlock_destroy(&ep->inner_lock);
        pthread_mutex_destroy(&ep->lock);
        pthread_cond_destroy(&ep->cond);
        kvf_free(ep);
        return KVF_ERR_NO_RESOURCE;
    }
    kvf_info("fault: wrapping %s ep to %s: seed %lu, delay %u+%u ms, drop "
             "%.4f, fail after %lu, reset every %lu",
             ep->inner_ops->name, address, (unsigned long)spec->seed,
             spec->delay_ms, spec->jitter_ms, spec->drop,
             (unsigned long)spec->fail_after, (unsigned long)spec->reset_after);
    *ops_p = &kvf_fault_ops;
    *ep_p = ep;
    return KVF_OK;
}

/* The hook: wraps every ep when the `fault` key (KVF_FAULT) is set,
 * none otherwise. A bad spec closes the inner ep and fails the open. */
static kvf_status_t kvf_fault_hook_wrap(const kvf_tl_peer_info_t *peer,
                                        int listed,
                                        const kvf_transport_ops_t **ops_p,
                                        kvf_tl_ep_t **ep_p)
{
    kvf_fault_spec_t spec;
    kvf_status_t status;
    int active;

    (void)listed;
    status = kvf_fault_parse(kvf_config_str(&kvf_fault_config, "fault"), &spec,
                             &active);
    if (status == KVF_OK && active) {
        status = kvf_fault_wrap(&spec, peer->cfg->timeout_ms, peer->iface,
                                peer->address, ops_p, ep_p);
    }
    if (status != KVF_OK) {
        kvf_error("fault: cannot wrap the ep to %s: %s", peer->address,
                  kvf_status_str(status));
        (*ops_p)->ep_close(*ep_p);
    }
    return status;
}

const kvf_tl_hook_t kvf_fault_hook = {
    .name = "fault",
    .wrap = kvf_fault_hook_wrap,
};
