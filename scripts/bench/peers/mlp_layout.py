"""The MLP's shape and its pipeline split, without torch: the model-parallel peer
(torch_mp_mlp.py, under torch 2.15) and scripts/bench/model_parallel (Debian's Python)
both cut the stages here."""


def widths(hidden):
    """784, the comma-separated hidden widths, 10."""
    return [784] + [int(h) for h in hidden.split(",")] + [10]


def linear_sizes(dims):
    """Each Linear's parameter count (weight and bias)."""
    return [dims[i] * dims[i + 1] + dims[i + 1] for i in range(len(dims) - 1)]


def partition(dims, stages):
    """Per stage the Linears [first, end): contiguous, the split whose largest stage (in
    parameters) is smallest, each boundary (walking back from the last stage) the earliest
    that keeps that optimum: ddprun's partition_layers, so both sides cut alike."""
    sizes = linear_sizes(dims)
    n = len(sizes)
    if not 1 <= stages <= n:
        raise ValueError(f"{stages} pipeline stages for {n} Linears")
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]  # best[k][j]: Linears [0, j) in k stages
    best[1] = [float(x) for x in prefix]
    for k in range(2, stages + 1):
        for j in range(k, n + 1):
            best[k][j] = min(max(best[k - 1][i], prefix[j] - prefix[i]) for i in range(k - 1, j))
    ranges, end = [], n
    for k in range(stages, 1, -1):
        i = k - 1
        while max(best[k - 1][i], prefix[end] - prefix[i]) > best[k][end]:
            i += 1
        ranges.append((i, end))
        end = i
    return [(0, end)] + ranges[::-1]


def stage_params(hidden, stages):
    """The parameters each stage holds."""
    dims = widths(hidden)
    sizes = linear_sizes(dims)
    return [sum(sizes[f:e]) for f, e in partition(dims, stages)]
