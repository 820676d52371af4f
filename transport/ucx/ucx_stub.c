/*
 * ucx transport in a build without UCX: registered under its name so
 * that `--transport ucx` / KVF_TRANSPORTS=ucx say why it cannot work
 * (KVF_ERR_UNAVAILABLE, one error line) instead of "unknown transport".
 * Never chosen under transports=auto.
 */
#include "transport/transport.h"
#include "core/log.h"

static int kvf_ucx_stub_available(void)
{
    return 1; /* so that iface_open runs and says why */
}

static int kvf_ucx_stub_auto(void)
{
    return 0;
}

static kvf_status_t kvf_ucx_stub_open(const kvf_tl_config_t *cfg,
                                      const kvf_tl_target_t *target,
                                      kvf_tl_iface_t **iface_p)
{
    (void)cfg;
    (void)target;
    (void)iface_p;
    kvf_error("ucx: this build has no UCX support (libucx-dev was not found "
              "when it was configured; scripts/setup.sh installs it, then "
              "rebuild)");
    return KVF_ERR_UNAVAILABLE;
}

const kvf_transport_ops_t kvf_ucx_ops = {
    .name = "ucx",
    .available = kvf_ucx_stub_available,
    .auto_select = kvf_ucx_stub_auto,
    .iface_open = kvf_ucx_stub_open,
};
