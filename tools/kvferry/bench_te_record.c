/*
 * The record of `kvferry bench te --record DIR` (seed 003 §5): key
 * figures per block size (GB/s with the batch latency P50/P99), the curve
 * GB/s over block size, the estimate (throughput of the largest block,
 * measured in the same run), the gap at 64 KiB and the conclusion against
 * the issue-3 target (64 KiB blocks >= 90 % of the 64 MiB throughput).
 */
#include "tools/kvferry/bench_te.h"
#include "tools/kvferry/record.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"

int kvf_te_record(const kvf_te_opts_t *o, const char *transport,
                  const kvf_te_row_t *rows, unsigned nrows,
                  const kvf_te_verdict_t *v)
{
    char name[96], text[512], bstr[32], cstr[32], *raw = NULL;
    const char *op = o->op == KVF_OP_WRITE ? "write" : "read";
    size_t rawlen = 0;
    kvf_record_t *rec;
    FILE *mf;
    unsigned i;
    int rc;

    snprintf(name, sizeof(name), "bench te (%s, %s)", transport, op);
    rec = kvf_record_new(
        "bench", name,
        "small blocks do not collapse: at 64 KiB blocks the engine moves at "
        "least 90 % of what it moves at 64 MiB blocks");
    if (rec == NULL) {
        return -1;
    }
    kvf_record_hypothesis(rec, o->hypothesis);
    kvf_record_config(rec, "transport", transport);
    kvf_record_config(rec, "op", op);
    kvf_record_config_num(rec, "batch", o->batch);
    kvf_record_config_num(rec, "threads", o->threads);
    kvf_record_config_num(rec, "duration_ms", (double)o->duration_ms);
    kvf_record_config_num(rec, "min_batches", o->min_batches);
    kvf_record_config_num(rec, "rounds", o->rounds);
    kvf_record_config(rec, "inline",
                      o->no_inline ? "no"
                                   : "KVF_BATCH_INLINE (one request "
                                     "of each batch may move on the "
                                     "submitting thread)");
    kvf_record_config_num(rec, "conns", o->s.conns);
    kvf_record_config_num(rec, "pool_bytes", (double)o->s.pool);
    kvf_record_config(rec, "target",
                      o->s.target ? o->s.target : "spawned on 127.0.0.1");
    kvf_record_config(rec, "workload",
                      "each thread submits its own batches of consecutive "
                      "blocks of its pool slice (wrapping) and waits for "
                      "each; GB/s = 10^9 bytes/s over the wall time of all "
                      "threads");
    for (i = 0; i < nrows; i++) {
        kvf_fmt_size(rows[i].block, bstr, sizeof(bstr));
        snprintf(name, sizeof(name), "%s %s blocks (batch latency ms)", op,
                 bstr);
        kvf_record_figure(rec, name, rows[i].gb_s, "GB/s", rows[i].lat_p50_ms,
                          rows[i].lat_p99_ms);
        snprintf(name, sizeof(name), "%s GB/s over block size", op);
        kvf_record_point(rec, name, "block bytes", "GB/s",
                         (double)rows[i].block, rows[i].gb_s);
        snprintf(name, sizeof(name), "%s ops/s over block size", op);
        kvf_record_point(rec, name, "block bytes", "block operations/s",
                         (double)rows[i].block, rows[i].ops_s);
    }
    kvf_fmt_size(v->ref_block, bstr, sizeof(bstr));
    snprintf(text, sizeof(text),
             "throughput at %s blocks, measured in the same run "
             "(transport %s)",
             bstr, transport);
    kvf_record_estimate(rec, v->ref_gb_s, "GB/s", text);
    if (v->ratio >= 0 && v->check_block > 0) {
        kvf_fmt_size(v->check_block, cstr, sizeof(cstr));
        snprintf(text, sizeof(text),
                 "%s blocks reach %.1f %% of the %s throughput%s", cstr,
                 100.0 * v->ratio, bstr,
                 v->ratio < 1.0
                     ? "; the rest is per-block and per-batch cost "
                       "(request headers, completions, wake-ups) that "
                       "large blocks amortize"
                     : "; large blocks gain nothing over them here");
        kvf_record_gap(rec, v->ratio, text);
        snprintf(text, sizeof(text),
                 "%s blocks at %.1f %% of %s blocks (>= %.0f %% required)%s",
                 cstr, 100.0 * v->ratio, bstr, 100.0 * KVF_TE_TARGET,
                 strcmp(v->conclusion, "holds under conditions") == 0
                     ? "; the curve did not span 64 KiB .. 64 MiB"
                     : "");
    } else {
        snprintf(text, sizeof(text),
                 "no block size >= 64 KiB below the largest (%s) was "
                 "measured, so the target could not be checked",
                 bstr);
    }
    kvf_record_conclude(rec, v->conclusion, text);
    kvf_record_not_verified(rec, "bytes are not verified by `bench te` "
                                 "(`bench blocks --verify` checks them)");
    kvf_record_not_verified(rec, "one peer on the same host; a remote "
                                 "peer adds the NIC and the network");
    kvf_record_not_verified(rec, "other transports: run again with "
                                 "--transport NAME");
    mf = open_memstream(&raw, &rawlen);
    if (mf != NULL) {
        kvf_te_json(mf, o, transport, rows, nrows, v);
        fclose(mf);
        kvf_record_raw(rec, raw);
    }
    free(raw);
    rc = kvf_record_write(rec, o->record);
    kvf_record_free(rec);
    return rc;
}
