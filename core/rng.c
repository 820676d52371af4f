/*
 * kvf_rng_fill: the generator's 64-bit outputs laid down in order, so the
 * same seed gives the same bytes on every run and host.
 */
#include "core/rng.h"

#include <string.h>

void kvf_rng_fill(kvf_rng_t *r, void *buf, size_t len)
{
    /* the state in a local: buf may alias *r as far as the compiler
     * knows (bytes), which would put a store and a reload of the state
     * on every step's dependency chain */
    kvf_rng_t g = *r;
    unsigned char *p = buf;
    uint64_t v;

    while (len >= 8) {
        v = kvf_rng_next(&g);
        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len > 0) {
        v = kvf_rng_next(&g);
        memcpy(p, &v, len);
    }
    *r = g;
}
