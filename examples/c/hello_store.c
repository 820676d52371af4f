/*
 * hello_store: the smallest program over the installed kvferry library.
 * Connects to a store master, puts 64 KiB under a key, gets them back
 * into a second buffer and compares. Build against an installed kvferry:
 *
 *   cc hello_store.c $(pkg-config --cflags --libs kvferry) -o hello_store
 *   ./hello_store 127.0.0.1:17800
 */
#include <kvferry/kvferry.h>
#include <kvferry/store.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN (64u << 10)

static int fail(const char *what, kvf_status_t st)
{
    fprintf(stderr, "hello_store: %s: %s (%s)\n", what, kvf_status_str(st),
            kvf_status_name(st));
    return 1;
}

/* Puts src under key, reads it back into dst, compares. */
static int roundtrip(kvf_store_h st, char *src, char *dst)
{
    const char *key = "hello/0";
    size_t got = 0;
    kvf_status_t s;
    unsigned i;

    for (i = 0; i < LEN; i++) {
        src[i] = (char)(i * 31 + 7);
    }
    s = kvf_store_put(st, key, src, LEN, NULL);
    if (s != KVF_OK) {
        return fail("put", s);
    }
    s = kvf_store_get(st, key, dst, LEN, &got, 0);
    if (s != KVF_OK) {
        return fail("get", s);
    }
    if (got != LEN || memcmp(src, dst, LEN) != 0) {
        fprintf(stderr, "hello_store: bytes differ\n");
        return 1;
    }
    s = kvf_store_remove(st, key);
    if (s != KVF_OK) {
        return fail("remove", s);
    }
    return 0;
}

int main(int argc, char **argv)
{
    kvf_store_params_t p = {.field_mask = KVF_STORE_PARAM_MASTER};
    kvf_store_h st;
    kvf_region_h r;
    kvf_status_t s;
    char *buf;
    int rc;

    p.master = argc > 1 ? argv[1] : "127.0.0.1:17800";
    s = kvf_store_connect(&p, &st);
    if (s != KVF_OK) {
        return fail("connect", s);
    }
    buf = calloc(2, LEN);
    if (buf == NULL) {
        kvf_store_disconnect(st);
        return 1;
    }
    s = kvf_engine_reg(kvf_store_engine(st), buf, 2 * LEN, KVF_MEM_HOST, 0, &r);
    if (s != KVF_OK) {
        free(buf);
        kvf_store_disconnect(st);
        return fail("register", s);
    }
    rc = roundtrip(st, buf, buf + LEN);
    kvf_engine_dereg(kvf_store_engine(st), r);
    free(buf);
    kvf_store_disconnect(st);
    if (rc == 0) {
        printf("hello_store: ok (kvferry %s)\n", kvf_version());
    }
    return rc;
}
