/*
 * Public calls of kvferry/perf.h that are not the engine's own data path:
 * the transports built in. A thin wrapper, so programs need no private
 * header.
 */
#include <kvferry/engine_perf.h>

#include "transport/transport.h"

size_t kvf_transport_names(const char **names, size_t max)
{
    size_t i;

    for (i = 0; kvf_transports[i] != NULL; i++) {
        if (names != NULL && i < max) {
            names[i] = kvf_transports[i]->name;
        }
    }
    return i;
}
