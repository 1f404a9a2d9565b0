"""Pick the winners of a skip_oracle run (tools/device_s9.sh sweepab) for an in-process A/B: the
real variants (env: and cfg: parts only) that saved at least --min us at the deepest depth and did
not lose at the others (where the log has `short&V`, V must not lose against `short` either).
Prints the --ab B setting (MINFER_X=v ...; cfg: winners as one table, skip_oracle.table_with) on
its last line, or nothing when no variant wins.
    python tools/sweep_pick.py oracle.log [--min 4]"""
import re
import sys


def tables(text: str) -> dict:
    """{depth: {variant: saved us}} from skip_oracle's tables."""
    out, depth = {}, None
    for line in text.splitlines():
        m = re.match(r"depth (\d+): graph on the GPU", line)
        if m:
            depth = int(m.group(1))
            out[depth] = {}
            continue
        m = re.match(r"\| (\S+) \| (\d+) \(sd \d+\) \| (-?\d+) \|", line)
        if m and depth is not None:
            out[depth][m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out


def winners(t: dict, least: float) -> list:
    deep = max(t)
    won = []
    for v, (_, saved) in t[deep].items():
        parts = v.split("&")
        if v == "base" or not all(p.startswith(("env:", "cfg:", "planes:")) for p in parts):
            continue
        cfg_keys = {p[4:].split("=")[0] for p in parts if p.startswith("cfg:")}
        if any(p[7:].split("=")[0] not in cfg_keys for p in parts if p.startswith("planes:")):
            continue                    # a layout needs its config in the table (its tenth field)
        if saved < least or any(d[v][1] < 0 for d in t.values() if v in d):
            continue
        shallow = [d for dd, d in t.items() if dd != deep]
        if any(f"short&{v}" in d and "short" in d and d[f"short&{v}"][0] > d["short"][0] for d in shallow):
            continue
        won.append((saved, v))
    return [v for _, v in sorted(won, reverse=True)]


def b_setting(won: list) -> str:
    env, cfgs = {}, {}
    for v in won:                       # best first: a later cfg of the same shape is dropped
        parts = v.split("&")
        tiles = {p[7:].replace("+", " ").split("=")[0]: int(p.split("=")[1]) for p in parts if p.startswith("planes:")}
        for p in parts:
            if p.startswith("planes:"):
                continue
            if p.startswith("cfg:"):
                key, cfg = p[4:].replace("+", " ").split("=")
                if key in tiles:        # the planes: part becomes the config's tenth field (tile rows = BN)
                    vals = cfg.split(",")
                    vals += ["1", "0", "0", "0", "0", "0", "0"][len(vals) - 4:]
                    vals[9] = "1" if tiles[key] else "0"
                    cfg = ",".join(vals)
                cfgs.setdefault(key, cfg)
            else:
                for item in p[4:].split(" "):
                    k, _, val = item.partition("=")
                    env[k] = ",".join(dict.fromkeys(x for x in env.get(k, "").split(",") + val.split(",") if x)) \
                        if k == "MINFER_PDL_EARLY_SITES" else val
    if cfgs:
        from skip_oracle import table_with      # noqa: E402 -- tools/ is the script's directory
        env["MINFER_GEMV_Q8G_TABLE"] = table_with(cfgs)
    return " ".join(f"{k}={v}" for k, v in env.items())


if __name__ == "__main__":
    least = float(sys.argv[sys.argv.index("--min") + 1]) if "--min" in sys.argv else 4.0
    t = tables(open(sys.argv[1]).read())
    won = winners(t, least) if t else []
    print("winners:", ", ".join(won) or "none", file=sys.stderr)
    if won:
        print(b_setting(won))
