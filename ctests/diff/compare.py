#!/usr/bin/env python3
"""Compare scenario outputs of MXNet and libmxkv, line by line, except the
lines whose prefix ctests/diff/deviations.txt lists (with its reason)."""
import sys


def main(ref_path, ours_path, dev_path):
    prefixes = []
    for line in open(dev_path, encoding="utf-8"):
        line = line.strip()
        if line and not line.startswith("#"):
            prefix, _, reason = line.partition(" -- ")
            if not reason:
                sys.exit(f"{dev_path}: entry without a reason: {line!r}")
            prefixes.append(prefix)
    ref = open(ref_path, encoding="utf-8").read().splitlines()
    ours = open(ours_path, encoding="utf-8").read().splitlines()

    def keep(lines):
        return [l for l in lines if not any(l.startswith(p) for p in prefixes)]

    used = {p for p in prefixes for l in ref + ours if l.startswith(p)}
    unused = [p for p in prefixes if p not in used]
    if unused:
        sys.exit(f"deviations listed but never seen (remove them): {unused}")
    a, b = keep(ref), keep(ours)
    if len(a) < 100:
        sys.exit(f"only {len(a)} comparable lines: the scenario did not run")
    bad = 0
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "<missing>"
        y = b[i] if i < len(b) else "<missing>"
        if x != y:
            bad += 1
            if bad <= 20:
                print(f"MXNet : {x}\nlibmxkv: {y}\n")
    skipped = len(ref) - len(a)
    print(f"differential: {len(a) - bad} passed, {bad} failed ({skipped} MXNet lines are listed deviations)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
