/*
 * Peers: resolve a segment name through the metadata backend, decode its
 * descriptor, and open an ep on the first transport, in local preference
 * order, that both sides have and that connects; a failed connect falls
 * through to the next transport. Every registered hook (transport/hook.h:
 * fault injection, the same-host GPU path) is then offered the open ep
 * and may wrap it. A hook named in the transports list (or "auto") is
 * told so; with a hook listed, tcp stays the fallback even when the list
 * names no other transport. Views of a peer's memory (kvferry/view.h)
 * forward to its ep.
 */
#include "engine/engine_int.h"

#include <kvferry/view.h>
#include <stddef.h>
#include "transport/hook.h"
#include "core/alloc.h"
#include "core/log.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Preference order: the engine's `transports` list when given, else the
 * order of the compiled-in registry (same-host transports first). */
static int kvf_peer_rank(kvf_engine_h e, const char *name)
{
    char list[128], *tok, *save;
    int rank = 0, hook = 0;
    size_t i;

    if (strcmp(e->transports, "auto") != 0) {
        snprintf(list, sizeof(list), "%s", e->transports);
        for (tok = strtok_r(list, ",", &save); tok != NULL;
             tok = strtok_r(NULL, ",", &save), rank++) {
            if (strcmp(tok, name) == 0) {
                return rank;
            }
            hook |= kvf_tl_hook_find(tok) != NULL;
        }
        /* a hook wraps another transport: tcp is its last resort */
        return (hook && strcmp(name, "tcp") == 0) ? rank : -1;
    }
    for (i = 0; kvf_transports[i] != NULL; i++) {
        if (strcmp(kvf_transports[i]->name, name) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* Offers the open ep to every registered hook, innermost first. */
static kvf_status_t kvf_peer_hooks(kvf_peer_h peer, const kvf_seg_desc_t *desc,
                                   kvf_tl_iface_t *iface, const char *address)
{
    kvf_engine_h e = peer->engine;
    kvf_tl_peer_info_t info;
    kvf_status_t status;
    size_t i;
    int listed;

    memset(&info, 0, sizeof(info));
    info.name = peer->name;
    info.cfg = &e->cfg;
    info.iface = iface;
    info.address = address;
    info.same_host = desc->host_id == kvf_seg_host_id();
    info.same_process = info.same_host && desc->pid == (uint32_t)getpid();
    info.regions = desc->regions;
    info.nregions = desc->nregions;
    for (i = 0; kvf_tl_hooks[i] != NULL; i++) {
        listed = strcmp(e->transports, "auto") == 0 ||
                 kvf_peer_rank(e, kvf_tl_hooks[i]->name) >= 0;
        status = kvf_tl_hooks[i]->wrap(&info, listed, &peer->ops, &peer->ep);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

static kvf_status_t kvf_peer_connect(kvf_peer_h peer,
                                     const kvf_seg_desc_t *desc)
{
    kvf_engine_h e = peer->engine;
    int order[KVF_ENGINE_TL_MAX], ranks[KVF_ENGINE_TL_MAX];
    kvf_status_t status = KVF_ERR_NO_TRANSPORT;
    unsigned i, j, n = 0;
    int k, rank, tmp;

    /* local ifaces the peer also has, sorted by rank */
    for (i = 0; i < e->ntl; i++) {
        rank = kvf_peer_rank(e, e->tl[i].ops->name);
        if (rank < 0) {
            continue;
        }
        for (j = 0; j < desc->ntl; j++) {
            if (strcmp(desc->tl[j].name, e->tl[i].ops->name) == 0) {
                order[n] = (int)i;
                ranks[n] = rank;
                n++;
                break;
            }
        }
    }
    for (i = 1; i < n; i++) {
        for (k = (int)i; k > 0 && ranks[k - 1] > ranks[k]; k--) {
            tmp = ranks[k];
            ranks[k] = ranks[k - 1];
            ranks[k - 1] = tmp;
            tmp = order[k];
            order[k] = order[k - 1];
            order[k - 1] = tmp;
        }
    }
    for (i = 0; i < n; i++) {
        kvf_engine_tl_t *tl = &e->tl[order[i]];

        for (j = 0; j < desc->ntl; j++) {
            if (strcmp(desc->tl[j].name, tl->ops->name) == 0) {
                break;
            }
        }
        status = tl->ops->ep_open(tl->iface, desc->tl[j].address, &peer->ep);
        if (status == KVF_OK) {
            peer->ops = tl->ops;
            status = kvf_peer_hooks(peer, desc, tl->iface, desc->tl[j].address);
        }
        if (status == KVF_OK) {
            kvf_info("peer %s via %s (%s)", peer->name, tl->ops->name,
                     desc->tl[j].address);
            return KVF_OK;
        }
        kvf_info("peer %s: transport %s failed (%s), trying the next",
                 peer->name, tl->ops->name, kvf_status_str(status));
    }
    kvf_error("no transport reaches peer %s (tried %u)", peer->name, n);
    return (n == 0) ? KVF_ERR_NO_TRANSPORT : status;
}

kvf_status_t kvf_peer_open(kvf_engine_h e, const char *segment_name,
                           kvf_peer_h *peer_p)
{
    kvf_seg_desc_t desc;
    kvf_status_t status;
    kvf_peer_h peer;
    void *buf = NULL;
    size_t len = 0;

    if (e == NULL || segment_name == NULL || peer_p == NULL ||
        strlen(segment_name) >= KVF_SEG_NAME_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = e->meta->ops->resolve(e->meta, segment_name,
                                   (int)e->cfg.timeout_ms, &buf, &len);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_seg_desc_decode(buf, len, &desc);
    kvf_free(buf);
    if (status != KVF_OK) {
        kvf_seg_desc_release(&desc);
        return status;
    }
    peer = kvf_calloc(1, sizeof(*peer));
    if (peer == NULL) {
        kvf_seg_desc_release(&desc);
        return KVF_ERR_NO_MEMORY;
    }
    peer->engine = e;
    snprintf(peer->name, sizeof(peer->name), "%s", segment_name);
    status = kvf_peer_connect(peer, &desc);
    if (status != KVF_OK) {
        kvf_seg_desc_release(&desc);
        kvf_free(peer);
        return status;
    }
    peer->nregions = desc.nregions;
    peer->regions = desc.regions; /* ownership moves to the peer */
    pthread_mutex_lock(&e->peers_lock);
    peer->next = e->peers;
    e->peers = peer;
    pthread_mutex_unlock(&e->peers_lock);
    *peer_p = peer;
    return KVF_OK;
}

void kvf_peer_close(kvf_peer_h peer)
{
    kvf_engine_h e;
    kvf_peer_h *pp;

    if (peer == NULL) {
        return;
    }
    e = peer->engine;
    pthread_mutex_lock(&e->peers_lock);
    for (pp = &e->peers; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == peer) {
            *pp = peer->next;
            break;
        }
    }
    pthread_mutex_unlock(&e->peers_lock);
    peer->ops->ep_close(peer->ep);
    kvf_free(peer->regions);
    kvf_free(peer);
}

const char *kvf_peer_transport(kvf_peer_h peer)
{
    return peer->ops->name;
}

kvf_status_t kvf_peer_checksum(kvf_peer_h peer, const uint64_t *remote,
                               const size_t *lengths, size_t count,
                               uint64_t *sums)
{
    if (peer == NULL ||
        (count > 0 && (remote == NULL || lengths == NULL || sums == NULL))) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (peer->ops->ep_checksum == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    return peer->ops->ep_checksum(peer->ep, remote, lengths, count, sums);
}

kvf_status_t kvf_peer_link_test(kvf_peer_h peer, kvf_op_type_t type,
                                void *local, uint64_t remote, size_t length,
                                double *seconds_p)
{
    if (peer == NULL || local == NULL || length == 0 || seconds_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (peer->ops->ep_link_test == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    return peer->ops->ep_link_test(peer->ep, type, local, remote, length,
                                   seconds_p);
}

kvf_status_t kvf_peer_region(kvf_peer_h peer, size_t index, uint64_t *addr_p,
                             size_t *length_p, kvf_mem_type_t *type_p)
{
    if (peer == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (index >= peer->nregions) {
        return KVF_ERR_NOT_FOUND;
    }
    if (addr_p != NULL) {
        *addr_p = peer->regions[index].addr;
    }
    if (length_p != NULL) {
        *length_p = (size_t)peer->regions[index].len;
    }
    if (type_p != NULL) {
        *type_p = peer->regions[index].type;
    }
    return KVF_OK;
}

/* The public view (kvferry/view.h) is the transport's, field for field:
 * the engine hands the caller's array to the transport as it is. */
_Static_assert(sizeof(kvf_view_t) == sizeof(kvf_tl_view_t) &&
                   offsetof(kvf_view_t, ptr) == offsetof(kvf_tl_view_t, ptr) &&
                   offsetof(kvf_view_t, map_base) ==
                       offsetof(kvf_tl_view_t, map_base) &&
                   offsetof(kvf_view_t, map_len) ==
                       offsetof(kvf_tl_view_t, map_len) &&
                   offsetof(kvf_view_t, status) ==
                       offsetof(kvf_tl_view_t, status),
               "kvf_view_t and kvf_tl_view_t differ");

kvf_status_t kvf_peer_view_open(kvf_peer_h peer, kvf_op_type_t type,
                                size_t count, const uint64_t *remote,
                                const uint64_t *lens, kvf_view_t *views,
                                uint64_t *until_ms_p, kvf_view_lease_h *lease_p)
{
    if (peer == NULL || count == 0 || remote == NULL || lens == NULL ||
        views == NULL || until_ms_p == NULL || lease_p == NULL ||
        (type != KVF_OP_READ && type != KVF_OP_WRITE)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (peer->ops->ep_view_open == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    /* the lease is the transport's, opaque to the caller */
    return peer->ops->ep_view_open(peer->ep, type, count, remote, lens,
                                   (kvf_tl_view_t *)views, until_ms_p,
                                   (kvf_tl_vlease_t **)lease_p);
}

kvf_status_t kvf_peer_view_close(kvf_peer_h peer, kvf_view_lease_h lease)
{
    if (peer == NULL || lease == NULL || peer->ops->ep_view_close == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    return peer->ops->ep_view_close((kvf_tl_vlease_t *)lease);
}

void kvf_view_unmap_hook(kvf_view_unmap_fn fn, void *arg)
{
    kvf_tl_unmap_hook(fn, arg);
}
