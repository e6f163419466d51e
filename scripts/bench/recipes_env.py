"""Worker environments side by side, for scripts/bench/recipes.

Each launcher's workers of one row are matched by RANK. A variable whose value is the same
for every rank under both launchers is left out. One that differs only in what is random
by nature (a port, a pid, a generated id or temporary folder) is listed apart, as
"differs by nature", with both values; everything else is a difference to explain.
"""
import re

# Digits of 4 or more (ports, pids, stamps) and hex runs of 8 or more (generated ids).
# A file under /tmp (a worker's error file) is named per run, each launcher its own way.
_RANDOM = [(re.compile(r"/tmp/\S*"), "<tmp file>"),
           (re.compile(r"[0-9a-f]{8,}(-[0-9a-f]{4,})*"), "<id>"), (re.compile(r"\d{4,}"), "<n>")]


def normalised(value):
    if value is None:
        return None
    for pattern, token in _RANDOM:
        value = pattern.sub(token, value)
    return value


def by_rank(records):
    """{rank: env} from the workers' records of one world."""
    return {int(r["env"]["RANK"]): r["env"] for r in records}


def _shown(values):
    """One value when every rank has the same, else 'r0=..., r1=...'."""
    distinct = set(values.values())
    if len(distinct) == 1:
        v = distinct.pop()
        return "(unset)" if v is None else v
    return ", ".join(f"r{r}={'(unset)' if v is None else v}" for r, v in sorted(values.items()))


def compare(torchrun, ddprun, fixed=(), ignore=()):
    """(differences, by nature): lists of (name, torchrun's value, ddprun's value) for two
    {rank: env} of the same ranks. A value that is one of `fixed` (words of the recipe, such
    as its ports) is never random by nature; `ignore` names variables left out."""
    ranks = sorted(set(torchrun) & set(ddprun))
    names = sorted({k for r in ranks for k in list(torchrun[r]) + list(ddprun[r])} - set(ignore))
    differs, nature = [], []
    for name in names:
        t = {r: torchrun[r].get(name) for r in ranks}
        d = {r: ddprun[r].get(name) for r in ranks}
        if t == d:
            continue
        row = (name, _shown(t), _shown(d))
        recipe_word = any(v in fixed for v in list(t.values()) + list(d.values()))
        if not recipe_word and all(normalised(t[r]) == normalised(d[r]) for r in ranks):
            nature.append(row)
        else:
            differs.append(row)
    return differs, nature


def note_for(name, notes):
    """The note on `name`, or on the longest prefix of it that ends in '_' or '*'."""
    if name in notes:
        return notes[name]
    prefixes = [k for k in notes if k.endswith("*") and name.startswith(k[:-1])]
    return notes[max(prefixes, key=len)] if prefixes else None


def print_comparison(differs, nature, notes, width=46):
    def cut(v):
        return v if len(v) <= width else v[:width - 3] + "..."
    if not differs and not nature:
        print("    environments: identical")
    for title, rows in (("differ", differs), ("differ by nature (random per run)", nature)):
        if not rows:
            continue
        print(f"    {title}:")
        print(f"      {'variable':<34} {'torchrun':<{width}} {'ddprun':<{width}}")
        for name, t, d in rows:
            print(f"      {name:<34} {cut(t):<{width}} {cut(d):<{width}}")
            note = note_for(name, notes)
            if note:
                print(f"      {'':<34} ^ {note}")
