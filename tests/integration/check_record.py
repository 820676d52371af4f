#!/usr/bin/env python3
"""Validates kvferry records (seed 003 §5) against docs/record.schema.json.

  check_record.py SCHEMA FILE...        every record must validate; its
                                        Markdown twin must exist with the
                                        template's headings, and its raw
                                        data file (if named) must parse
  check_record.py --env SCHEMA FILE     FILE is `kvferry bench env --json`
                                        output: validate it as a record's
                                        environment object
  check_record.py --negative SCHEMA FILE
                                        FILE is a valid record; broken
                                        copies of it (a required field
                                        removed, a bad enum, ...) must all
                                        FAIL validation

Files ending in .data.json are raw data, not records: they are skipped.
Exit 0 = pass, 1 = fail, 77 = skipped (python3-jsonschema missing).
"""
import copy
import json
import os
import sys

try:
    import jsonschema
except ImportError:
    print("python3 jsonschema module missing (apt-get install "
          "python3-jsonschema)", file=sys.stderr)
    sys.exit(77)

MD_HEADINGS = [
    "- **Experiment:**",
    "- **Date / executor:**",
    "## Environment",
    "## Hypothesis",
    "## Configuration",
    "## Results",
    "### Key figures",
    "| Figure | Value | Unit | P50 | P99 |",
    "## Gap to the estimate",
    "## Conclusion",
    "## Not verified",
]


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check_records(schema, files):
    v = validator(schema)
    bad = 0
    n = 0
    for path in files:
        if path.endswith(".data.json"):
            continue
        n += 1
        with open(path) as f:
            rec = json.load(f)
        errors = sorted(v.iter_errors(rec), key=lambda e: list(e.path))
        for e in errors:
            print("%s: %s: %s" % (path, "/".join(map(str, e.path)) or "(top)",
                                  e.message), file=sys.stderr)
            bad += 1
        md = path[:-len(".json")] + ".md"
        if not os.path.exists(md):
            print("%s: Markdown twin %s missing" % (path, md), file=sys.stderr)
            bad += 1
        else:
            with open(md) as f:
                text = f.read()
            for h in MD_HEADINGS:
                if h not in text:
                    print("%s: heading '%s' missing" % (md, h),
                          file=sys.stderr)
                    bad += 1
            if not errors and ("**%s**" % rec["conclusion"]) not in text:
                print("%s: conclusion not stated" % md, file=sys.stderr)
                bad += 1
        raw = rec.get("results", {}).get("raw_data") if not errors else None
        if raw:
            rp = os.path.join(os.path.dirname(path), raw)
            try:
                with open(rp) as f:
                    json.load(f)
            except (OSError, ValueError) as e:
                print("%s: raw data %s: %s" % (path, rp, e), file=sys.stderr)
                bad += 1
        if not errors:
            print("ok %s (%s, %d key figures, conclusion: %s)" %
                  (path, rec["name"], len(rec["results"]["key_figures"]),
                   rec["conclusion"]))
    if n == 0:
        print("no records given", file=sys.stderr)
        return 1
    return 1 if bad else 0


def check_env(schema, path):
    env_schema = {"$schema": schema.get("$schema"), "$defs": schema["$defs"],
                  "$ref": "#/$defs/environment"}
    with open(path) as f:
        env = json.load(f)
    errors = list(validator(env_schema).iter_errors(env))
    for e in errors:
        print("%s: %s: %s" % (path, "/".join(map(str, e.path)) or "(top)",
                              e.message), file=sys.stderr)
    if not errors:
        print("ok %s (environment: %s, %d CPUs, %d GPUs, %d NICs)" %
              (path, env["cpu"]["model"], env["cpu"]["logical"],
               len(env["gpus"]), len(env["nics"])))
    return 1 if errors else 0


def mutations(rec):
    """Broken copies of a valid record, each with what was broken."""
    def drop(key):
        r = copy.deepcopy(rec)
        del r[key]
        return r

    out = []
    for key in ("schema", "kind", "name", "date", "executor", "environment",
                "hypothesis", "configuration", "results", "estimate", "gap",
                "conclusion", "conclusion_text", "not_verified"):
        out.append(("without " + key, drop(key)))
    r = copy.deepcopy(rec)
    r["conclusion"] = "probably"
    out.append(("conclusion 'probably'", r))
    r = copy.deepcopy(rec)
    r["schema"] = "kvferry-record/0"
    out.append(("schema kvferry-record/0", r))
    r = copy.deepcopy(rec)
    r["date"] = "yesterday"
    out.append(("date 'yesterday'", r))
    r = copy.deepcopy(rec)
    r["executor"] = "nobody"
    out.append(("executor without host", r))
    r = copy.deepcopy(rec)
    r["kind"] = "drill"
    r.pop("drill", None)
    out.append(("drill without its drill object", r))
    r = copy.deepcopy(rec)
    del r["environment"]["cpu"]
    out.append(("environment without cpu", r))
    r = copy.deepcopy(rec)
    del r["results"]["raw_data"]
    out.append(("results without raw_data", r))
    r = copy.deepcopy(rec)
    r["results"]["key_figures"] = [{"name": "x", "value": 1, "unit": "GB/s"}]
    out.append(("key figure without p50/p99", r))
    r = copy.deepcopy(rec)
    r["results"]["series"] = [{"name": "s", "x_label": "x", "y_label": "y",
                               "points": [[1, 2, 3]]}]
    out.append(("series point of three numbers", r))
    r = copy.deepcopy(rec)
    r["unexpected"] = 1
    out.append(("unknown top-level field", r))
    return out


def check_negative(schema, path):
    v = validator(schema)
    with open(path) as f:
        rec = json.load(f)
    errors = list(v.iter_errors(rec))
    if errors:
        print("%s: the starting record is itself invalid: %s" %
              (path, errors[0].message), file=sys.stderr)
        return 1
    bad = 0
    muts = mutations(rec)
    for what, broken in muts:
        if v.is_valid(broken):
            print("broken record passed validation: %s" % what,
                  file=sys.stderr)
            bad += 1
    if not bad:
        print("ok: all %d broken copies of %s fail validation" %
              (len(muts), path))
    return 1 if bad else 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "--env":
        mode, schema_path, files = "env", argv[2], argv[3:]
    elif len(argv) >= 3 and argv[1] == "--negative":
        mode, schema_path, files = "negative", argv[2], argv[3:]
    elif len(argv) >= 2 and not argv[1].startswith("--"):
        mode, schema_path, files = "records", argv[1], argv[2:]
    else:
        print(__doc__, file=sys.stderr)
        return 2
    with open(schema_path) as f:
        schema = json.load(f)
    if mode == "env":
        return max([check_env(schema, p) for p in files] or [1])
    if mode == "negative":
        return max([check_negative(schema, p) for p in files] or [1])
    return check_records(schema, files)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
