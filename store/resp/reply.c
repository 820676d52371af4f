/*
 * Replies: each connection has a bounded output buffer that replies are
 * copied into; a long GET value is not copied but sent from the pool (or
 * a store view) with its header and trailing "\r\n" in one sendmsg. The
 * GET and SET replies written once their store batch ran are here too.
 * A long value sent from a view counts in resp_slow_mem while it is sent
 * (a slow reader may need it copied before the view's lease ends: that
 * copy is what the bound limits); one that does not fit is refused.
 */
#include "store/resp/resp_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

void kvf_resp_out(kvf_resp_conn_t *c, const void *p, size_t len)
{
    if (p == NULL && len > 0) {
        c->closing = 1; /* cannot happen: callers answer NULL values */
        return;
    }
    if (c->out_off > 0 && c->out_len + len > KVF_RESP_OUT_CAP) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_len + len > KVF_RESP_OUT_CAP) {
        c->closing = 1; /* cannot happen: callers stop at OUT_HIGH */
        return;
    }
    memcpy(c->out + c->out_len, p, len);
    c->out_len += len;
}

void kvf_resp_outs(kvf_resp_conn_t *c, const char *s)
{
    kvf_resp_out(c, s, strlen(s));
}

void kvf_resp_int(kvf_resp_conn_t *c, long long v)
{
    char b[32];

    kvf_resp_out(c, b, (size_t)snprintf(b, sizeof(b), ":%lld\r\n", v));
}

void kvf_resp_bulk(kvf_resp_conn_t *c, const void *p, size_t len)
{
    char b[32];

    if (p == NULL && len > 0) { /* a string the pool had no room for */
        kvf_resp_outs(c, "-ERR value pool full, try again\r\n");
        return;
    }
    kvf_resp_out(c, b, (size_t)snprintf(b, sizeof(b), "$%zu\r\n", len));
    kvf_resp_out(c, p, len);
    kvf_resp_out(c, "\r\n", 2);
}

void kvf_resp_err(kvf_resp_conn_t *c, const char *fmt, const char *a)
{
    char b[256];
    size_t n = (size_t)snprintf(b, sizeof(b) - 2, fmt, a);

    if (n > sizeof(b) - 3) {
        n = sizeof(b) - 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (b[i] == '\r' || b[i] == '\n') {
            b[i] = ' ';
        }
    }
    memcpy(b + n, "\r\n", 2);
    kvf_resp_out(c, b, n + 2);
}

void kvf_resp_bad(kvf_resp_conn_t *c, const char *why)
{
    kvf_resp_err(c, "-ERR %s", why);
    c->closing = 1;
    atomic_fetch_add(&c->lp->srv->stats.proto_errors, 1);
}

int kvf_resp_blocked(const kvf_resp_conn_t *c)
{
    return c->big != NULL || c->closing || c->op != KVF_RESP_OP_NONE ||
           c->out_len - c->out_off > KVF_RESP_OUT_HIGH;
}

void kvf_resp_store_err(kvf_resp_conn_t *c, kvf_status_t st)
{
    kvf_resp_err(c, "-ERR store: %s", kvf_status_str(st));
}

/* A GET's answer once its batch ran. */
void kvf_resp_get_reply(kvf_resp_conn_t *c)
{
    kvf_resp_val_t *v = c->oget;
    kvf_status_t st = c->ost;
    char hdr[32];

    c->oget = NULL;
    if (st == KVF_ERR_NO_KEY || st == KVF_ERR_NOT_READY) {
        kvf_resp_outs(c, "$-1\r\n");
    } else if (st == KVF_ERR_NO_MEMORY) {
        kvf_resp_outs(c, "-ERR value pool full, try again\r\n");
    } else if (st != KVF_OK || v == NULL) {
        kvf_resp_store_err(c, st != KVF_OK ? st : KVF_ERR_IO);
    } else if (v->len <= KVF_RESP_INLINE_MAX) {
        kvf_resp_bulk(c, v->p, v->len);
    } else if ((v->vl != NULL || v->heap) &&
               !kvf_resp_slow_take(c->lp->srv, v->len)) {
        /* values from views being sent already hold resp_slow_mem */
        kvf_resp_outs(c, "-ERR too many values being sent to slow readers "
                         "(resp_slow_mem), try again\r\n");
    } else {
        kvf_resp_out(c, hdr,
                     (size_t)snprintf(hdr, sizeof(hdr), "$%zu\r\n", v->len));
        c->big_resv = (v->vl != NULL || v->heap) ? v->len : 0;
        v->refs++;
        c->big = v;
        c->big_off = 0;
    }
    kvf_resp_val_unref(c->lp->srv, v);
}

void kvf_resp_set_reply(kvf_resp_conn_t *c)
{
    if (c->ost == KVF_ERR_NO_RESOURCE) {
        kvf_resp_outs(c, "-ERR value pool full, try again\r\n");
    } else if (c->ost != KVF_OK) {
        kvf_resp_store_err(c, c->ost);
    } else {
        kvf_resp_outs(c, "+OK\r\n");
    }
}

/* Sends what it can; -1 on a broken connection. */
int kvf_resp_flush(kvf_resp_conn_t *c)
{
    static const char crlf[] = "\r\n";
    struct msghdr msg = {0};
    struct iovec iov[3];
    ssize_t n;
    size_t k, out, blen = 0, tail;

    for (;;) {
        out = c->out_len - c->out_off;
        k = 0;
        if (out > 0) {
            iov[k++] = (struct iovec){c->out + c->out_off, out};
        }
        if (c->big != NULL) { /* the value, then its "\r\n": one send */
            if (kvf_resp_val_ready(c->big) < 0) {
                return -1; /* its bytes were lost: cut the reply */
            }
            blen = c->big->len;
            if (c->big_off < blen) {
                iov[k++] =
                    (struct iovec){c->big->p + c->big_off, blen - c->big_off};
            }
            tail = c->big_off > blen ? c->big_off - blen : 0;
            iov[k++] = (struct iovec){(char *)crlf + tail, 2 - tail};
        }
        if (k == 0) {
            c->out_len = c->out_off = 0;
            return 0;
        }
        msg.msg_iov = iov;
        msg.msg_iovlen = k;
        n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        }
        k = (size_t)n < out ? (size_t)n : out;
        c->out_off += k;
        n -= (ssize_t)k;
        if (c->big != NULL) {
            c->big_off += (size_t)n;
            if (c->big_off == blen + 2) {
                kvf_resp_slow_give(c->lp->srv, c->big_resv);
                c->big_resv = 0;
                kvf_resp_val_unref(c->lp->srv, c->big);
                c->big = NULL;
            }
        }
        if (c->out_off == c->out_len && c->big == NULL) {
            c->out_len = c->out_off = 0;
            return 0;
        }
    }
}
