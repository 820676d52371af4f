/*
 * shm transport: what each side trusts of the other, and only as far as
 * the kernel proves it.
 *
 * - Peer credentials: SO_PEERCRED of the local socket gives the uid and
 *   gid of the process at the other end (the connecting initiator, or
 *   the target that called listen()), as the kernel recorded them. Each
 *   side accepts its own uid, the uid named by shm_allow_uid (root is
 *   allowed only this way, "0") and the gid named by shm_allow_gid.
 * - Memfds handed over: the initiator maps one only after fstat shows
 *   that it really holds the bytes the target announced and F_GET_SEALS
 *   that it can never shrink, so touching the mapping can never raise
 *   SIGBUS, whatever the target does later.
 * - Windows: a target hands out, of an allocation, only the pages of the
 *   registered range an access lies in (kvf_shm_window), mapped at the
 *   matching memfd offset; the rest of the allocation stays out of reach.
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

extern const kvf_config_table_t kvf_shm_config;

/* A numeric id from the shm config key name, or -1 when unset. */
static long kvf_shm_allowed_id(const char *name)
{
    const char *v = kvf_config_override(&kvf_shm_config, name);
    char *end;
    long id;

    if (v == NULL || *v == '\0') {
        return -1;
    }
    errno = 0;
    id = strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || id < 0 || id > (long)UINT32_MAX) {
        kvf_log_rl(KVF_LOG_WARN, "shm: %s=%s is not a numeric id; ignored",
                   name, v);
        return -1;
    }
    return id;
}

kvf_status_t kvf_shm_peer_check(int fd, const char *who)
{
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    long uid, gid;

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
        clen != sizeof(cred)) {
        kvf_log_rl(KVF_LOG_WARN, "shm: no credentials of the %s: %m", who);
        return KVF_ERR_PEER_CREDS;
    }
    if (cred.uid == geteuid()) {
        return KVF_OK;
    }
    uid = kvf_shm_allowed_id("shm_allow_uid");
    gid = kvf_shm_allowed_id("shm_allow_gid");
    if ((uid >= 0 && (uid_t)uid == cred.uid) ||
        (gid >= 0 && (gid_t)gid == cred.gid)) {
        return KVF_OK;
    }
    kvf_log_rl(KVF_LOG_WARN,
               "shm: %s pid %d uid %u gid %u refused (this process: uid %u; "
               "allow with shm_allow_uid or shm_allow_gid)",
               who, (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid,
               (unsigned)geteuid());
    return KVF_ERR_PEER_CREDS;
}

kvf_status_t kvf_shm_memfd_check(int fd, uint64_t off, uint64_t len)
{
    struct stat st;
    int seals;

    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: the target sent a memfd that can shrink (seals "
                   "0x%x); refused",
                   seals < 0 ? 0 : (unsigned)seals);
        return KVF_ERR_UNSAFE_MEMORY;
    }
    if (fstat(fd, &st) != 0 || st.st_size < 0 || off + len < off ||
        (uint64_t)st.st_size < off + len) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: the target announced %lu bytes at offset %lu of a "
                   "memfd of %ld; refused",
                   (unsigned long)len, (unsigned long)off, (long)st.st_size);
        return KVF_ERR_UNSAFE_MEMORY;
    }
    return KVF_OK;
}

int kvf_shm_window(const kvf_shm_alloc_info_t *a, const kvf_tl_mem_t *mem,
                   kvf_shm_window_t *w)
{
    uint64_t rs, re, ae = a->base + a->len, unit = a->unit ? a->unit : 4096;

    if (mem->len == 0 || mem->base >= ae || mem->base + mem->len <= a->base) {
        return -1; /* the region is unknown or lies elsewhere */
    }
    rs = mem->base > a->base ? mem->base : a->base;
    re = mem->base + mem->len < ae ? mem->base + mem->len : ae;
    w->alloc = a->id;
    w->reg_base = rs;
    w->reg_len = re - rs;
    w->base = a->base + (rs - a->base) / unit * unit;
    w->off = w->base - a->base;
    w->len = a->base + (re - a->base + unit - 1) / unit * unit - w->base;
    if (w->base + w->len > ae) {
        w->len = ae - w->base;
    }
    return 0;
}

void kvf_shm_wintab_init(kvf_shm_wintab_t *t)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->lock, NULL);
}

void kvf_shm_wintab_free(kvf_shm_wintab_t *t)
{
    pthread_mutex_destroy(&t->lock);
    kvf_free(t->w);
    t->w = NULL;
    t->n = t->cap = 0;
}

/* Forgets windows of freed allocations (their ids stay unused). Lock
 * held. */
static void kvf_shm_wintab_prune(kvf_shm_wintab_t *t)
{
    size_t i = 0;

    while (i < t->n) {
        if (!kvf_shm_mem_alive(t->w[i].alloc)) {
            t->w[i] = t->w[--t->n];
        } else {
            i++;
        }
    }
}

uint64_t kvf_shm_wintab_id(kvf_shm_wintab_t *t, kvf_shm_window_t *w)
{
    kvf_shm_window_t *grown;
    size_t i;

    pthread_mutex_lock(&t->lock);
    for (i = 0; i < t->n; i++) {
        const kvf_shm_window_t *e = &t->w[i];

        if (e->alloc == w->alloc && e->base == w->base && e->len == w->len &&
            e->reg_base == w->reg_base && e->reg_len == w->reg_len) {
            w->id = e->id;
            pthread_mutex_unlock(&t->lock);
            return w->id;
        }
    }
    kvf_shm_wintab_prune(t);
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;

        grown = kvf_realloc(t->w, cap * sizeof(*grown));
        if (grown == NULL) {
            pthread_mutex_unlock(&t->lock);
            return 0;
        }
        t->w = grown;
        t->cap = cap;
    }
    w->id = ++t->next_id;
    t->w[t->n++] = *w;
    pthread_mutex_unlock(&t->lock);
    return w->id;
}

int kvf_shm_wintab_get(kvf_shm_wintab_t *t, uint64_t id, kvf_shm_window_t *w)
{
    size_t i;
    int rc = -1;

    pthread_mutex_lock(&t->lock);
    for (i = 0; i < t->n; i++) {
        if (t->w[i].id == id) {
            *w = t->w[i];
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void kvf_shm_wintab_drop(kvf_shm_wintab_t *t, uint64_t id)
{
    size_t i;

    pthread_mutex_lock(&t->lock);
    for (i = 0; i < t->n; i++) {
        if (t->w[i].id == id) {
            t->w[i] = t->w[--t->n];
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
}
