"""The course's explanatory figures: each drawn from numbers the library itself computes.

``docs/tools/figures.py`` renders and checks them with the others. Each figure
here has two functions:

* ``record_<name>(out)`` runs the library on a tiny case (level 1's attention
  weights, level 0's RoPE, a level-2 model's attention calls with and without
  the cache, level 4's kernels in Triton's interpreter) and writes what it saw to
  ``docs/data/<name>.json``;
* ``draw_<name>(data, png)`` draws the PNG from that file alone.

The docs tests re-record every file and compare it with the committed one
(``tests/test_docs_course.py``), so a figure cannot show what the code no longer
does; its sidecar digest then ties the PNG to the file and the drawing code.

* ``attention_shapes``: one head's attention as the chapters write it, the
  shapes and the numbers: ``Q Kᵀ`` -> scores ``(T, S)`` -> causal mask ->
  softmax -> ``P V`` (docs/prelude.md);
* ``rope_pair``: one pair of features of a query turning in its plane as its
  position grows, a fast pair and a slow one, and a query and a key at two
  placements with the same distance (docs/prelude.md);
* ``kv_cache``: the queries and keys of every attention call of generation,
  recomputing the prefix at each step and with the KV cache (docs/level0_loops.md);
* ``flash_tiles``: one query tile on chip while the key/value tiles stream
  past it, FlashAttention-1's order beside it, and the tile of scores of each step;
  ``draw_flash_state`` draws, from the same file, the running max ``m``, sum ``l``
  and accumulator after each tile, read off level 4's forward kernel
  (docs/level4_triton_kernel.md);
* ``backward_loops``: which (query tile, key tile) pairs each program of the
  two backward kernels visits, and in which order, found by poisoning tiles
  with NaN (docs/level4_part2.md);
* ``model_diagram``: the decoder-only transformer as a block diagram, labelled
  with the sizes of the model of real text (docs/prelude.md);
* ``split_heads``: where each feature of a token goes when level 0's
  ``split_heads`` cuts ``D`` into ``H`` heads (docs/prelude.md);
* ``speculation``: each pass of speculative decoding along one row, the guesses kept,
  rejected and never tested, and the target's own token (docs/speculative.md);
* ``paged_turns``: the blocks of a paged KV cache after each turn of the engine, held by
  the requests, shared through the prefix cache, kept filed when no one holds them
  (docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

ROUND = 6  # digits kept in the recorded files: far below what a figure shows


def _rounded(x):
    """Nested lists of floats rounded to ROUND digits (numpy arrays and scalars too)."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [_rounded(a) for a in x]
    if isinstance(x, float):
        return x if math.isinf(x) else round(x, ROUND)
    return x


def _write(out: Path, record: dict) -> None:
    out.write_text(json.dumps(record) + "\n")


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


# ----------------------------------------------------------------------------- attention shapes


def record_attention_shapes(out: Path) -> None:
    """One head, ``T = S = 5``, ``Dh = 4``, causal: q, k, v and every step after them,
    from level 1's ``attention_weights`` (weights and their mask) and a product with v."""
    import numpy as np

    from levels.level1_numpy import ops

    rng = np.random.default_rng(3)
    T = S = 5
    Dh = 4
    q, k, v = (np.round(rng.standard_normal((1, 1, n, Dh)), 1) for n in (T, S, S))
    scale = 1 / math.sqrt(Dh)
    scores = scale * q[0, 0] @ k[0, 0].T  # (T, S)
    allowed = ops.position_mask(T, S, causal=True, window=None)  # (T, S)
    weights, _ = ops.attention_weights(q, k, causal=True)  # (1, 1, T, S)
    output = ops.attention(q, k, v, causal=True)  # (1, 1, T, Dv)
    _write(
        out,
        {
            "made_by": "record_attention_shapes",
            "scale": scale,
            "q": _rounded(q[0, 0]),
            "k": _rounded(k[0, 0]),
            "v": _rounded(v[0, 0]),
            "scores": _rounded(scores),
            "allowed": allowed.tolist(),
            "weights": _rounded(weights[0, 0]),
            "output": _rounded(output[0, 0]),
        },
    )


def draw_attention_shapes(data: Path, png: Path) -> None:
    """Seven matrices in two rows a page can hold (the inputs and the scores, then the
    weights and the output), with their shapes, the numbers written in each cell."""
    import numpy as np

    r = json.loads(data.read_text())
    q, k, v = (np.array(r[n]) for n in ("q", "k", "v"))
    scores, weights, output = (np.array(r[n]) for n in ("scores", "weights", "output"))
    allowed = np.array(r["allowed"])
    masked = np.where(allowed, scores, np.nan)
    T, S, Dh, Dv = len(q), len(k), q.shape[1], v.shape[1]
    panels = [
        ("Q", q, f"(T, Dh) = ({T}, {Dh})", "query i", "feature", "coolwarm", 2.0),
        ("Kᵀ", k.T, f"(Dh, S) = ({Dh}, {S})", "feature", "key j", "coolwarm", 2.0),
        ("1. scores = Q Kᵀ / √Dh", scores, f"(T, S) = ({T}, {S})", "query i", "key j", "coolwarm", 2.0),
        ("2. causal mask", masked, "-inf where key j > query i", "query i", "key j", "coolwarm", 2.0),
        ("3. P = softmax of each row", weights, "(T, S), each row sums to 1", "query i", "key j", "Greens", 1.0),
        ("V", v, f"(S, Dv) = ({S}, {Dv})", "key j", "feature", "coolwarm", 2.0),
        ("4. O = P V", output, f"(T, Dv) = ({T}, {Dv})", "query i", "feature", "coolwarm", 2.0),
    ]  # fmt: skip
    fig = _figure(10.0, 7.4)
    rows = fig.subfigures(2, 1)
    first, second = panels[:4], panels[4:]
    axes = list(rows[0].subplots(1, 4, width_ratios=[p[1].shape[1] for p in first]))
    axes += list(rows[1].subplots(1, 3, width_ratios=[p[1].shape[1] for p in second]))
    for ax, (title, m, shape, ylabel, xlabel, cmap, lim) in zip(axes, panels, strict=True):
        lo = 0.0 if cmap == "Greens" else -lim
        ax.imshow(m, cmap=cmap, vmin=lo, vmax=lim)
        for (i, j), x in np.ndenumerate(m):
            if np.isnan(x):
                ax.add_patch(_hatch(j, i))
                ax.text(j, i, "-inf", ha="center", va="center", fontsize=7.5)
                continue
            dark = abs(x) > 0.7 * lim  # the ends of both colour maps are dark
            ax.text(j, i, f"{x:.2f}", ha="center", va="center", fontsize=8.5,
                    color="white" if dark else "black")  # fmt: skip
        ax.set_title(f"{title}\n{shape}", fontsize=10.5)
        ax.set_xticks(range(m.shape[1]))
        ax.set_yticks(range(m.shape[0]))
        ax.tick_params(labelsize=7)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    fig.suptitle(
        "one head of causal attention, T = S = 5, Dh = 4 (level 1's attention_weights):\n"
        "1. the scores, scaled, 2. masked, 3. normalised row by row, 4. averaging the values",
        fontsize=11,
    )
    fig.savefig(png, dpi=110)


def _hatch(j, i):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.85", edgecolor="0.6", hatch="//")


# ----------------------------------------------------------------------------- a RoPE pair


def record_rope_pair(out: Path) -> None:
    """A (1, 1, 1, Dh = 8) vector rotated by level 0's ``rope``: its pair 0 (one radian a
    position) at positions 0..7, its pair 3 (base^(-6/8) radians) at 0, 100, ..., 700; and
    pair 0 of a query and a key placed at (m, n) = (2, 0) and (7, 5)."""
    from levels.level0_loops import ops

    base = 10000.0
    vec = [1.0, 0.0, 0.3, 0.2, -0.5, 0.4, 1.0, 0.0]
    fast, slow = list(range(8)), list(range(0, 800, 100))
    qv, kv = [1.0, 0.0] + [0.0] * 6, [0.6, 0.8] + [0.0] * 6
    placed = {
        f"{m},{n}": {
            "q": ops.rope([[[qv]]], [[m]], base)[0][0][0][:2],
            "k": ops.rope([[[kv]]], [[n]], base)[0][0][0][:2],
        }
        for m, n in ((2, 0), (7, 5))
    }
    _write(
        out,
        {
            "made_by": "record_rope_pair",
            "base": base,
            "pair0": {"positions": fast, "points": _rounded([ops.rope([[[vec]]], [[m]], base)[0][0][0][0:2] for m in fast])},
            "pair3": {"positions": slow, "points": _rounded([ops.rope([[[vec]]], [[m]], base)[0][0][0][6:8] for m in slow])},
            "placed": _rounded(placed),
        },
    )  # fmt: skip


def draw_rope_pair(data: Path, png: Path) -> None:
    """Three planes: pair 0 at positions 0..7, pair 3 at 0..700, and a query/key placed twice."""
    import numpy as np

    r = json.loads(data.read_text())
    base = r["base"]
    fig = _figure(9.0, 3.9)
    axes = fig.subplots(1, 3)
    for ax, name, title in (
        (axes[0], "pair0", f"pair 0 at positions 0..7:\nθ₀ = 1 rad = {math.degrees(1):.1f}° a step"),
        (axes[1], "pair3", f"pair 3 at positions 0, 100, ..., 700:\nθ₃ = {base:g}^(-6/8) rad = "
                           f"{math.degrees(base ** -0.75):.3f}° a step"),
    ):  # fmt: skip
        for c, (m, (a, b)) in enumerate(zip(r[name]["positions"], r[name]["points"], strict=True)):
            ax.annotate(
                "", (a, b), (0, 0), arrowprops=dict(arrowstyle="-|>", color=f"C{c}", lw=1.6)
            )
            ax.text(
                a * 1.16, b * 1.16, f"m={m}", color=f"C{c}", fontsize=8, ha="center", va="center"
            )
        ax.add_patch(_circle(1.0))
        ax.set_title(title, fontsize=9)
    ax = axes[2]
    for (key, placed), colour in zip(r["placed"].items(), ("C0", "C3"), strict=True):
        m, n = key.split(",")
        for what, style in (("q", "-"), ("k", "--")):
            a, b = placed[what]
            ax.annotate("", (a, b), (0, 0),
                        arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.8, ls=style))  # fmt: skip
            label = f"q at m={m}" if what == "q" else f"k at n={n}"
            ax.text(a * 1.2, b * 1.2, label, color=colour, fontsize=8, ha="center", va="center")
    ax.add_patch(_circle(1.0))
    qa, ka = (np.array(r["placed"]["2,0"][w]) for w in ("q", "k"))
    qb, kb = (np.array(r["placed"]["7,5"][w]) for w in ("q", "k"))
    ax.set_title(
        f"pair 0 of q and k at m - n = 2, twice:\nq·k = {qa @ ka:.4f} and {qb @ kb:.4f}",
        fontsize=9,
    )
    for ax in axes:
        ax.set_aspect("equal")
        ax.set_xlim(-1.4, 1.4)
        ax.set_ylim(-1.4, 1.4)
        ax.axhline(0, color="0.85", lw=0.8)
        ax.axvline(0, color="0.85", lw=0.8)
        ax.set_xlabel("first feature of the pair (a)", fontsize=8)
        ax.tick_params(labelsize=7.5)
    axes[0].set_ylabel("second feature (b)", fontsize=8)
    fig.suptitle(
        "RoPE turns pair i of q and k by m·θᵢ at position m, in the pair's own plane\n"
        "and at its own speed (levels.level0_loops.ops.rope)",
        fontsize=10.5,
    )
    fig.savefig(png, dpi=110)


def _circle(radius: float):
    from matplotlib.patches import Circle

    return Circle((0, 0), radius, fill=False, color="0.7", ls=":")


# ----------------------------------------------------------------------------- the KV cache


def record_kv_cache(out: Path) -> None:
    """Every attention call of layer 0 while a level-2 model generates 4 tokens after a
    3-token prompt, without and with the KV cache: ``(T, S)`` of each call, read
    through a ``Kernels`` hook."""
    import torch

    import levels
    from levels import TransformerConfig, init_params

    L2 = levels.load("level2_torch_manual")
    config = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=1,
                               max_seq_len=16)  # fmt: skip
    calls: list[tuple[int, int]] = []

    def recording(q, k, v, **kw):  # (B, H, T, Dh), (B, Hkv, S, Dh)
        calls.append((q.shape[-2], k.shape[-2]))
        return L2.attention(q, k, v, **kw)

    model = L2.DecoderOnlyTransformer(
        config, init_params(config, "decoder_only", seed=0),
        kernels=dataclasses.replace(L2.LEVEL2_KERNELS, attention=recording),
    )  # fmt: skip
    record = {"made_by": "record_kv_cache", "prompt": 3, "new": 4}
    with torch.no_grad():
        for use_cache in (False, True):
            calls.clear()
            tokens = model.generate(torch.tensor([[3, 4, 5]]), 4, use_cache=use_cache)
            record["cached" if use_cache else "recomputed"] = [list(c) for c in calls]
            record["tokens"] = tokens[0].tolist()
    _write(out, record)


def draw_kv_cache(data: Path, png: Path) -> None:
    """Two grids, one row per attention call, one column per position: what the call
    computes (its queries, and the keys and values it writes) and what it reads from the cache."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    r = json.loads(data.read_text())
    P, new = r["prompt"], r["new"]
    width = P + new - 1  # the last token is generated, never attended
    fig = _figure(9.0, 3.7)
    axes = fig.subplots(1, 2)
    colours = ["white", "#f4a261", "#2a9d8f"]  # unused, computed, read from the cache
    for ax, name, title in (
        (axes[0], "recomputed", "without a cache: each step recomputes the prefix"),
        (axes[1], "cached", "with the KV cache: a step computes one new position"),
    ):
        computed = sum(T for T, _ in r[name])
        title = f"{title}\n({computed} positions computed for {new} tokens)"
        grid = np.zeros((len(r[name]), width), dtype=int)
        for row, (T, S) in enumerate(r[name]):
            grid[row, S - T : S] = 1  # this call's queries: their q, k and v computed now
            grid[row, : S - T] = 2  # keys and values computed by an earlier call
        ax.imshow(grid, cmap=ListedColormap(colours), vmin=0, vmax=2)
        for row, (T, S) in enumerate(r[name]):
            ax.text(width - 0.45, row, f"  T={T}, S={S}", va="center", fontsize=8)
        ax.set_xticks(range(width), [f"{p}" for p in range(width)], fontsize=8)
        labels = [f"forward {i + 1}" for i in range(len(r[name]))]
        if name == "cached":
            labels = ["prefill"] + [f"decode step {i}" for i in range(1, len(r[name]))]
        ax.set_yticks(range(len(r[name])), labels, fontsize=8)
        ax.set_xlabel("position of the token", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(np.arange(-0.5, width), minor=True)
        ax.set_yticks(np.arange(-0.5, len(r[name])), minor=True)
        ax.grid(which="minor", color="0.6", lw=0.6)
        ax.tick_params(which="minor", length=0)
        ax.set_xlim(-0.5, width + 1.8)
    handles = [
        Patch(facecolor=colours[1], edgecolor="0.6", label="computed in this call: queries, new keys and values"),
        Patch(facecolor=colours[2], edgecolor="0.6", label="keys and values read from the cache"),
    ]  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(
        f"layer 0's attention calls while a level-2 model generates {new} tokens after a "
        f"{P}-token prompt\n(generate, use_cache False and True)",
        fontsize=10,
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- flash tiles

FLASH_T, FLASH_S, FLASH_DH, FLASH_BLOCK = 16, 64, 16, 16


def record_flash_tiles(out: Path) -> None:
    """Level 4's forward kernel (tiles of 16 x 16) on one query tile of 16 rows against
    the first 16, 32, 48 and 64 keys: after key tile ``j`` the kernel's state is what it
    returns for the keys up to that tile, its output ``acc / l`` and ``lse = m + log l``
    (the same tiles in the same order). ``m`` is the running maximum of the scaled scores,
    from the same float32 products; ``l = exp(lse - m)``; ``acc = out · l``. Natural units."""
    import numpy as np
    import torch

    import levels

    L4 = levels.load("level4_triton_kernel")  # first: without triton, LevelUnavailable says why
    from levels.level4_triton_kernel.tiles import Tiles

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, FLASH_DH, generator=g) for n in (FLASH_T, FLASH_S, FLASH_S))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    scale = 1 / math.sqrt(FLASH_DH)
    scores = (scale * q[0, 0] @ k[0, 0].T).numpy()  # (T, S) float32, for m only
    steps = []
    with torch.no_grad():
        for end in range(FLASH_BLOCK, FLASH_S + 1, FLASH_BLOCK):
            o, lse = L4.attention(
                q.to(device), k[:, :, :end].to(device), v[:, :, :end].to(device),
                return_lse=True, tiles=Tiles(FLASH_BLOCK, FLASH_BLOCK), splits=1,
            )  # fmt: skip
            o, lse = o[0, 0].cpu().numpy(), lse[0, 0].cpu().numpy()  # (T, Dv), (T,)
            m = scores[:, :end].max(1)  # (T,)
            l = np.exp(lse - m)
            steps.append({"keys": end, "m": m, "l": l, "acc": o * l[:, None], "out": o})
    _write(
        out,
        {
            "made_by": "record_flash_tiles",
            "T": FLASH_T, "S": FLASH_S, "Dh": FLASH_DH, "block": FLASH_BLOCK,
            "scores": _rounded(scores),
            "steps": [{key: _rounded(val) for key, val in s.items()} for s in steps],
        },
    )  # fmt: skip


TILE_COLOURS = ("#8ecae6", "#b5e48c", "#ffd6a5", "#cdb4db")  # key tile j, in memory and its scores


def draw_flash_tiles(data: Path, png: Path) -> None:
    """Top: the memory picture of this kernel's loop order, FlashAttention-2's (the Q tile
    and the state on chip, K and V tiles streaming past), and FlashAttention-1's beside it
    (a K, V tile on chip, the Q tiles and their state streaming through memory). Below: the
    score tile of each step, framed in its key tile's colour."""
    import numpy as np

    r = json.loads(data.read_text())
    block, n_tiles = r["block"], len(r["steps"])
    scores = np.array(r["scores"])
    fig = _figure(9.0, 7.0)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.25, 1.0])
    orders = top.subplots(1, 2)
    _flash2_order(orders[0], n_tiles)
    _flash1_order(orders[1], n_tiles)
    lim = float(np.abs(scores).max())
    for j, ax in enumerate(bottom.subplots(1, n_tiles)):
        ax.imshow(scores[:, j * block : (j + 1) * block], cmap="coolwarm", vmin=-lim, vmax=lim)
        ax.set_title(f"step {j}: S = Q K{j}ᵀ · scale\nkeys {j * block}..{(j + 1) * block - 1}",
                     fontsize=9)  # fmt: skip
        ax.set_xticks([0, block - 1], [j * block, (j + 1) * block - 1], fontsize=8)
        ax.set_yticks([0, r["T"] - 1], [0, r["T"] - 1], fontsize=8)
        ax.set_xlabel("key", fontsize=8.5)
        for spine in ax.spines.values():
            spine.set(color=TILE_COLOURS[j % 4], linewidth=4)
        if j == 0:
            ax.set_ylabel("query row", fontsize=8.5)
    top.suptitle(
        f"level 4's forward kernel, one query tile of {r['T']} rows against {r['S']} keys in "
        f"tiles of {block}\n(Triton's interpreter): the loop's two orders, and the scores of "
        "one tile at a time",
        fontsize=10,
    )
    fig.savefig(png, dpi=110)


def draw_flash_state(data: Path, png: Path) -> None:
    """m, l and the error of the output acc / l of every query row after each key tile of
    the same run, three rows in colour."""
    import numpy as np

    r = json.loads(data.read_text())
    steps = r["steps"]
    final = np.array(steps[-1]["out"])
    fig = _figure(9.0, 3.8)
    axes = fig.subplots(1, 3)
    x = [s["keys"] for s in steps]
    m = np.array([s["m"] for s in steps])  # (tiles, T)
    l = np.array([s["l"] for s in steps])
    err = np.array([np.abs(np.array(s["out"]) - final).max(1) for s in steps])  # (tiles, T)
    shown = (0, 5, 11)
    for ax, values, title in (
        (axes[0], m, "m: the largest score so far\n(never falls)"),
        (axes[1], l, "l: sum of exp(s - m) so far\n(times exp(m_old - m_new) as m rises)"),
        (axes[2], err, "|acc / l - final output|,\nlargest feature (0 at the end)"),
    ):
        for row in range(values.shape[1]):
            highlight = row in shown
            ax.plot(x, values[:, row], marker="o" if highlight else None, lw=1.8 if highlight else 0.6,
                    color=f"C{shown.index(row)}" if highlight else "0.75",
                    label=f"query row {row}" if highlight else None, zorder=3 if highlight else 1)  # fmt: skip
        ax.set_xticks(x)
        ax.set_xlabel("keys read (after tile 0, 1, 2, 3)", fontsize=8.5)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "the state of every query row after each key tile (grey: the other rows),\n"
        "read off the kernel's output and log-sum-exp",
        fontsize=10,
    )
    fig.savefig(png, dpi=110)


def _flash2_order(ax, n_tiles: int) -> None:
    """FlashAttention-2's loop order, this kernel's: the Q tile and the state of its rows
    held on chip, the K and V tiles read one after another."""
    from matplotlib.patches import FancyArrowPatch

    _memory(ax, "this kernel: FlashAttention-2's order", "HBM (slow, large)",
            "on chip (registers, fast, small)", "Q tile\nheld for\nthe whole loop", "#f4a261")  # fmt: skip
    for i in range(n_tiles):
        for y, name in ((7.7, "K"), (6.1, "V")):
            _tile(ax, i, y, f"{name}{i}", TILE_COLOURS[i % 4], fontsize=9)
    ax.text(6.9, 2.0, "this step's S tile;\nm, l, acc: the state\nof every row, float32",
            ha="center", va="center", fontsize=8.5)  # fmt: skip
    ax.add_patch(FancyArrowPatch((6.6, 6.0), (6.6, 3.4), arrowstyle="-|>", mutation_scale=14))
    ax.text(6.4, 5.1, "Kj, Vj, one tile after another", fontsize=8, ha="right", va="center")


def _flash1_order(ax, n_tiles: int) -> None:
    """FlashAttention-1's loop order (Dao et al. 2022, Algorithm 1), in the style of the
    kernel's panel: a K, V tile held on chip, the query tiles with their output and m, l
    read from memory, updated, and written back."""
    from matplotlib.patches import FancyArrowPatch

    _memory(ax, "FlashAttention-1's order, for comparison", "HBM (K, V: each tile read once)",
            "on chip", "Kj, Vj tile\nheld for the\ninner loop", "#8ecae6")  # fmt: skip
    for i in range(n_tiles):
        _tile(ax, i, 7.7, f"Q{i}", "#f4a261", fontsize=8)
        _tile(ax, i, 6.1, f"O,m,l {i}", "#f4a261", fontsize=8, alpha=0.5)
    ax.text(6.8, 2.0, "each Qi, with its\nOi, mi, li read,\nupdated, written\nback", ha="center",
            va="center", fontsize=8.5)  # fmt: skip
    ax.add_patch(FancyArrowPatch((4.6, 6.0), (4.6, 3.4), arrowstyle="-|>", mutation_scale=14))
    ax.add_patch(FancyArrowPatch((5.6, 3.4), (5.6, 6.0), arrowstyle="-|>", mutation_scale=14))
    ax.text(5.8, 5.1, "Oi, mi, li back", fontsize=8, va="center")


def _memory(ax, title: str, hbm: str, chip: str, held: str, held_colour: str) -> None:
    """What both loop orders' panels share: HBM above, the chip below, the tile it holds."""
    from matplotlib.patches import Rectangle

    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.axis("off")
    ax.set_title(title, fontsize=9.5)
    ax.add_patch(Rectangle((0.2, 5.6), 9.6, 4.2, facecolor="#fdf0d5", edgecolor="0.5"))
    ax.text(5, 9.3, hbm, ha="center", fontsize=9)
    ax.add_patch(Rectangle((0.2, 0.2), 9.6, 4.4, facecolor="#e9f5db", edgecolor="0.5"))
    ax.text(0.6, 4.05, chip, fontsize=9)
    ax.add_patch(Rectangle((0.6, 0.7), 3.2, 2.6, facecolor=held_colour, edgecolor="0.3"))
    ax.text(2.2, 2.0, held, ha="center", va="center", fontsize=8.5)


def _tile(ax, i: int, y: float, label: str, colour: str, fontsize: float, alpha=1.0) -> None:
    """Tile i of a row of tiles in HBM, at height y, labelled."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((1.2 + 2.1 * i, y), 1.8, 1.1, facecolor=colour, alpha=alpha,
                           edgecolor="0.3"))  # fmt: skip
    ax.text(2.1 + 2.1 * i, y + 0.55, label, ha="center", va="center", fontsize=fontsize)


# ----------------------------------------------------------------------------- backward loops

BWD_T, BWD_S, BWD_BLOCK = 64, 64, 16


def record_backward_loops(out: Path) -> None:
    """The (query tile, key tile) pairs each backward kernel of level 4 visits, causal, T = S
    = 64, tiles of 16: the dK/dV kernel's with dO of one query tile poisoned with NaN (a
    key tile whose program read those rows gets NaN in dK), the dQ kernel's with one key
    tile of K poisoned (a query tile whose program read it gets NaN in dQ)."""
    import warnings

    import torch

    import levels

    levels.load("level4_triton_kernel")  # first: without triton, LevelUnavailable says why
    from levels.level4_triton_kernel.flash_backward import flash_backward
    from levels.level4_triton_kernel.flash_forward import flash_forward
    from levels.level4_triton_kernel.tiles import Tiles

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 16, generator=g).to(device) for n in (BWD_T, BWD_S, BWD_S))
    d_out = torch.randn(1, 1, BWD_T, 16, generator=g).to(device)
    tiles = Tiles(BWD_BLOCK, BWD_BLOCK)
    scale = 0.25
    o, lse = flash_forward(q, k, v, None, True, scale, tiles=tiles)  # (B, H, T, Dv), (B*H, T)
    n_q, n_k = BWD_T // BWD_BLOCK, BWD_S // BWD_BLOCK
    dkdv, dq = [], []
    with warnings.catch_warnings():  # the interpreter's reductions meet the NaN made on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        for i in range(n_q):
            poisoned = d_out.clone()
            poisoned[:, :, i * BWD_BLOCK : (i + 1) * BWD_BLOCK] = float("nan")
            _, dk, _ = flash_backward(poisoned, q, k, v, o, lse, None, True, scale, tiles=tiles)
            for j in range(n_k):
                if dk[0, 0, j * BWD_BLOCK : (j + 1) * BWD_BLOCK].isnan().any():
                    dkdv.append([i, j])
        for j in range(n_k):
            poisoned = k.clone()
            poisoned[:, :, j * BWD_BLOCK : (j + 1) * BWD_BLOCK] = float("nan")
            dqs, _, _ = flash_backward(
                d_out, q, poisoned, v, o, lse, None, True, scale, tiles=tiles
            )
            for i in range(n_q):
                if dqs[0, 0, i * BWD_BLOCK : (i + 1) * BWD_BLOCK].isnan().any():
                    dq.append([i, j])
    _write(
        out,
        {
            "made_by": "record_backward_loops",
            "T": BWD_T, "S": BWD_S, "block": BWD_BLOCK, "causal": True,
            "dkdv": sorted(dkdv), "dq": sorted(dq),
        },
    )  # fmt: skip


def draw_backward_loops(data: Path, png: Path) -> None:
    """Two tile grids (query tiles down, key tiles across): each program's tiles in its
    colour, numbered in the order its loop visits them, skipped tiles left blank."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    r = json.loads(data.read_text())
    n_q, n_k = r["T"] // r["block"], r["S"] // r["block"]
    fig = _figure(9.0, 5.2)
    axes = fig.subplots(1, 2)
    for ax, name, title, program_of in (
        (axes[0], "dkdv", "dK, dV: one program per key tile (a column),\n"
         "its loop down the query tiles that see it", lambda i, j: j),
        (axes[1], "dq", "dQ: one program per query tile (a row),\n"
         "its loop across the key tiles it sees (the forward's)", lambda i, j: i),
    ):  # fmt: skip
        visited = [tuple(p) for p in r[name]]
        for i in range(n_q):
            for j in range(n_k):
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="white", edgecolor="0.8"))
                if _partial(i, j, r["block"], r["T"], r["S"]):  # the causal rule cuts this tile
                    ax.add_patch(Rectangle((j, i), 1, 1, facecolor="none", edgecolor="0.35",
                                           hatch="////", lw=0, zorder=2))  # fmt: skip
        for program in range(n_k if name == "dkdv" else n_q):
            mine = sorted(p for p in visited if program_of(*p) == program)
            colour = f"C{program}"
            for step, (i, j) in enumerate(mine):
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=colour, alpha=0.35, edgecolor="0.4"))
                ax.text(j + 0.5, i + 0.5, f"{step + 1}", ha="center", va="center", fontsize=10)
            for (i0, j0), (i1, j1) in zip(mine, mine[1:], strict=False):
                ax.add_patch(FancyArrowPatch((j0 + 0.5, i0 + 0.5), (j1 + 0.5, i1 + 0.5),
                                             arrowstyle="-|>", mutation_scale=12, color=colour,
                                             shrinkA=9, shrinkB=9, lw=1.4))  # fmt: skip
        ax.set_xlim(0, n_k)
        ax.set_ylim(n_q, 0)
        ax.set_aspect("equal")
        ax.set_xticks([j + 0.5 for j in range(n_k)], [f"keys\n{16 * j}..{16 * j + 15}" for j in range(n_k)],
                      fontsize=8)  # fmt: skip
        ax.set_yticks([i + 0.5 for i in range(n_q)], [f"queries\n{16 * i}..{16 * i + 15}" for i in range(n_q)],
                      fontsize=8)  # fmt: skip
        ax.set_title(title, fontsize=9.5)
    fig.suptitle(
        f"level 4's backward kernels, causal, T = S = {r['T']}, tiles of {r['block']}: which tiles "
        "each program reads\n(found by poisoning tiles with NaN); blank tiles are never loaded; "
        "hatched: the diagonal tiles,\nloaded and masked (some of their pairs are not allowed)",
        fontsize=10,
    )
    fig.savefig(png, dpi=110)


def _partial(i: int, j: int, block: int, T: int, S: int) -> bool:
    """Query tile ``i`` and key tile ``j`` hold both allowed and forbidden pairs (causal,
    bottom-right): the tile is on the diagonal, and its loads are masked."""
    queries = range(i * block, min(T, (i + 1) * block))
    keys = range(j * block, min(S, (j + 1) * block))
    allowed = [key <= query + S - T for query in queries for key in keys]
    return any(allowed) and not all(allowed)


# ----------------------------------------------------------------------------- the model


def record_model_diagram(out: Path) -> None:
    """The sizes of the model of real text (``lab.text.TextSpec``'s config) and the shapes of
    its parameters, which the prelude's block diagram is labelled with."""
    from lab.text import TextSpec
    from levels.common.params import param_shapes

    c = TextSpec().config()
    shapes = param_shapes(c, "decoder_only")
    _write(
        out,
        {
            "made_by": "record_model_diagram",
            "V": c.vocab_size, "D": c.d_model, "H": c.n_heads, "F": c.d_ff,
            "layers": c.n_layers, "T": c.max_seq_len,
            "shapes": {name: list(s) for name, s in shapes.items() if name.startswith(
                ("token_embedding", "layers.0.", "norm."))},
        },
    )  # fmt: skip


def draw_model_diagram(data: Path, png: Path) -> None:
    """The decoder-only transformer as boxes, bottom to top, each arrow labelled with the
    shape it carries; the repeated block drawn once, inside a frame."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    r = json.loads(data.read_text())
    V, D, H, F, L = r["V"], r["D"], r["H"], r["F"], r["layers"]
    fig = _figure(7.2, 8.2)
    ax = fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 17.4)
    ax.axis("off")

    def box(y, text, colour, x=2.2, w=5.6, h=1.0):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", facecolor=colour,
                                    edgecolor="0.35"))  # fmt: skip
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9.5)

    def arrow(y0, y1, label="", x=5.0):
        ax.add_patch(FancyArrowPatch((x, y0), (x, y1), arrowstyle="-|>", mutation_scale=12,
                                     color="0.25"))  # fmt: skip
        if label:
            ax.text(x + 0.25, (y0 + y1) / 2, label, va="center", fontsize=8.5, color="0.2")

    box(0.2, '"The cat sat on the mat."  (text)', "white")
    arrow(1.3, 2.0)
    box(2.0, f"tokenizer: byte-level BPE, V = {V} pieces", "#e5e5e5")
    arrow(3.1, 3.8, "ids (B, T): integers in [0, V)")
    box(3.8, f"embedding: row t of E (V, D) = ({V}, {D}), times √D", "#cde4f5")
    arrow(4.9, 5.8, f"x (B, T, D), D = {D}")
    ax.add_patch(FancyBboxPatch((1.4, 5.8), 7.2, 6.1, boxstyle="round,pad=0.1", facecolor="none",
                                edgecolor="0.5", ls="--"))  # fmt: skip
    ax.text(8.45, 11.55, f"× {L} blocks", ha="right", fontsize=9.5, color="0.3")
    box(6.1, "norm1 (LayerNorm)", "#f3e6c4", w=2.6)
    box(6.1, f"self-attention\n{H} heads of Dh = {D // H}, causal", "#f6c8a8", x=5.2, w=3.0)
    ax.add_patch(FancyArrowPatch((4.85, 6.6), (5.25, 6.6), arrowstyle="-|>", mutation_scale=10))
    ax.text(5.0, 7.55, "x = x + SelfAttention(norm1(x))", ha="center", fontsize=9)
    arrow(7.9, 8.9)
    box(8.9, "norm2 (LayerNorm)", "#f3e6c4", w=2.6)
    box(8.9, f"feed-forward\n{D} → F = {F} → {D}, GELU", "#d6ecc9", x=5.2, w=3.0)
    ax.add_patch(FancyArrowPatch((4.85, 9.4), (5.25, 9.4), arrowstyle="-|>", mutation_scale=10))
    ax.text(5.0, 10.35, "x = x + FeedForward(norm2(x))", ha="center", fontsize=9)
    arrow(11.9, 12.6, "x (B, T, D)")
    box(12.6, "final norm (LayerNorm)", "#f3e6c4")
    arrow(13.7, 14.4)
    box(14.4, f"head: x Eᵀ, the embedding reused ({D} → {V})", "#cde4f5")
    arrow(15.5, 16.2, f"logits (B, T, V): a score for each of the {V} next tokens")
    fig.suptitle(
        "the decoder-only transformer, bottom to top, as the model of real text sizes it\n"
        f"(V = {V}, D = {D}, H = {H}, F = {F}, {L} blocks); each branch's output is added "
        "to x",
        fontsize=10,
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- splitting into heads

SPLIT_T, SPLIT_D, SPLIT_H = 3, 8, 2


def record_split_heads(out: Path) -> None:
    """Level 0's ``split_heads`` and ``merge_heads`` on a ``(1, T, D)`` array whose entry
    ``(t, d)`` is ``10 t + d``, so the picture can show where each number goes."""
    from levels.level0_loops import ops

    x = [[[float(10 * t + d) for d in range(SPLIT_D)] for t in range(SPLIT_T)]]  # (1, T, D)
    heads = ops.split_heads(x, SPLIT_H)  # (1, H, T, Dh)
    _write(
        out,
        {
            "made_by": "record_split_heads",
            "x": x[0], "heads": heads[0], "merged_back": ops.merge_heads(heads)[0] == x[0],
        },
    )  # fmt: skip


def draw_split_heads(data: Path, png: Path) -> None:
    """x (T, D) with each feature coloured by the head it goes to, then the H matrices
    (T, Dh) it becomes."""
    import numpy as np
    from matplotlib.colors import ListedColormap

    r = json.loads(data.read_text())
    x, heads = np.array(r["x"]), np.array(r["heads"])
    T, D = x.shape
    H, _, Dh = heads.shape
    colours = ["#8ecae6", "#f4a261", "#b5e48c", "#cdb4db"]
    fig = _figure(9.0, 2.5)
    axes = fig.subplots(1, 1 + H, width_ratios=[D] + [Dh] * H)
    owner = np.repeat(np.arange(H), Dh)[None, :].repeat(T, 0)  # (T, D): the head of each feature
    axes[0].imshow(owner, cmap=ListedColormap(colours[:H]), vmin=0, vmax=H - 1)
    axes[0].set_title(f"q of one sequence: (T, D) = ({T}, {D})\nfeature d goes to head d // Dh",
                      fontsize=9.5)  # fmt: skip
    for (t, d), value in np.ndenumerate(x):
        axes[0].text(d, t, f"{value:.0f}", ha="center", va="center", fontsize=9)
    for h in range(H):
        ax = axes[1 + h]
        ax.imshow(np.full((T, Dh), h), cmap=ListedColormap(colours[:H]), vmin=0, vmax=H - 1)
        for (t, d), value in np.ndenumerate(heads[h]):
            ax.text(d, t, f"{value:.0f}", ha="center", va="center", fontsize=9)
        ax.set_title(f"head {h}: (T, Dh) = ({T}, {Dh})", fontsize=9.5)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks(range(T), [f"token {t}" for t in range(T)], fontsize=8)
    fig.suptitle(
        f"splitting into H = {H} heads (level 0's split_heads): the entry of token t, feature d "
        "is 10 t + d; merge_heads puts them back",
        fontsize=10,
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- speculation


def record_speculation(out: Path) -> None:
    """Each pass of speculative decoding along one row: the small level-1 model of
    docs/speculative.md, greedy, the n-gram draft (``max_n=4, min_n=2``) guessing up to 4
    tokens a pass. A draft that notes what it proposed, from how long a context; what each
    pass kept is what its guesses share with the tokens greedy decoding gives (greedy, a guess
    is kept iff it is the target's own token)."""
    import numpy as np

    import levels
    from engine import Counts, NGramDraft
    from levels import TransformerConfig, init_params

    config = TransformerConfig(vocab_size=16, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                               max_seq_len=96)  # fmt: skip
    params = init_params(config, "decoder_only", seed=1, scheme="random")
    params = {name: 4 * p if p.ndim == 2 else p for name, p in params.items()}
    model = levels.load("level1_numpy").DecoderOnlyTransformer(config, params)
    prompt = np.array([[5, 9, 2, 7, 5, 9, 2, 7, 5, 9]])  # (B=1, P=10)
    new = 30
    plain = model.generate(prompt, new)[0].tolist()

    class Noting(NGramDraft):
        def propose(self, context, k, row=0, sampling=None):
            tokens, q = super().propose(context, k, row, sampling)
            proposals.append((len(context), list(tokens)))
            return tokens, q

    proposals: list[tuple[int, list[int]]] = []
    counts = Counts()
    tokens = model.generate(prompt, new, draft=Noting(max_n=4, min_n=2), draft_tokens=4,
                            counts=counts)[0].tolist()  # fmt: skip
    passes = []
    for at, guesses in proposals:
        kept = 0
        while kept < len(guesses) and guesses[kept] == plain[at + kept]:
            kept += 1
        passes.append({"at": at, "guesses": guesses, "kept": kept,
                       "own": plain[at + kept] if at + kept < len(plain) else None})  # fmt: skip
    _write(out, {"made_by": "record_speculation", "prompt": prompt[0].tolist(), "k": 4,
                 "plain": plain, "same": tokens == plain, "passes": passes,
                 "counts": {"passes": counts.passes, "drafted": counts.drafted,
                            "accepted": counts.accepted}})  # fmt: skip


def draw_speculation(data: Path, png: Path) -> None:
    """One row of cells per pass of the target, one column per position of the answer: the
    guesses kept, the first rejected, those after it (never tested), and the target's own
    token that ends the pass, each cell with its token id."""
    from matplotlib.patches import Patch, Rectangle

    r = json.loads(data.read_text())
    P, passes = len(r["prompt"]), r["passes"]
    width = len(r["plain"]) - P
    colours = {"kept": "#8ecae6", "rejected": "#e76f51", "untested": "0.85", "own": "#2a9d8f"}
    fig = _figure(9.0, 0.28 * len(passes) + 1.6)
    ax = fig.subplots()
    for row, p in enumerate(passes):
        start = p["at"] - P
        cells = [("kept", str(t)) for t in p["guesses"][: p["kept"]]]
        if p["kept"] < len(p["guesses"]):  # the first rejected, the target's token in its place
            cells.append(("rejected", f"{p['guesses'][p['kept']]}→{p['own']}"))
            cells += [("untested", str(t)) for t in p["guesses"][p["kept"] + 1 :]]
        elif p["own"] is not None:  # every guess kept (or none made): one token of its own
            cells.append(("own", str(p["own"])))
        for i, (kind, label) in enumerate(cells):
            ax.add_patch(Rectangle((start + i, row), 1, 1, facecolor=colours[kind],
                                   edgecolor="white"))  # fmt: skip
            ax.text(start + i + 0.5, row + 0.5, label, ha="center", va="center",
                    fontsize=6.5 if kind == "rejected" else 7,
                    color="white" if kind == "own" else "black")  # fmt: skip
        ax.text(width + 0.3, row + 0.5, f"{len(p['guesses'])} guessed, {p['kept']} kept",
                va="center", fontsize=7)  # fmt: skip
    ax.set_xlim(0, width + 5)
    ax.set_ylim(len(passes), 0)
    ax.set_xticks([i + 0.5 for i in range(0, width, 5)], [str(i) for i in range(0, width, 5)],
                  fontsize=7)  # fmt: skip
    ax.set_yticks([i + 0.5 for i in range(len(passes))],
                  [f"pass {i + 1}" for i in range(len(passes))], fontsize=7)  # fmt: skip
    ax.set_xlabel("position in the answer (after the prompt's 10 tokens)", fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [
        Patch(facecolor=colours["kept"], label="guess kept (the target's own token)"),
        Patch(facecolor=colours["rejected"],
              label="first guess rejected, guess→the target's own token in its place"),
        Patch(facecolor=colours["untested"], label="guesses after it, never tested"),
        Patch(facecolor=colours["own"], label="the target's own token, after every guess kept"),
    ]  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=7, frameon=False)
    c = r["counts"]
    fig.suptitle(
        f"the n-gram draft guessing up to {r['k']} tokens a pass, greedy, level 1's small model:\n"
        f"{width - 1} tokens after the first in {c['passes']} passes, {c['drafted']} guessed, "
        f"{c['accepted']} kept; a pass with no guess gives the target's token alone",
        fontsize=9,
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- paged turns


def record_paged_turns(out: Path) -> None:
    """The worked example of docs/serving.md: five requests on a small level-2 model, a pool
    of nine blocks of four positions, three requests at most, eight prompt positions a turn.
    After each turn: what the engine said, the requests holding each block (a block of a
    shared prefix is held by several), and the blocks no request holds that keep a filed
    prefix (``BlockPool.idle``)."""
    import levels
    from engine import Engine, Request
    from levels import TransformerConfig, init_params

    level = levels.load("level2_torch_manual")
    tiny = TransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                             max_seq_len=32)  # fmt: skip
    model = level.DecoderOnlyTransformer(tiny, init_params(tiny, "decoder_only", seed=0,
                                                           scheme="random"))  # fmt: skip
    engine = Engine(model, cache="paged", max_batch=3, blocks=9, block_size=4, prefill_tokens=8)
    system = list(range(40, 50))
    arrivals = {
        0: [Request(system + [3, 4], 4), Request([5, 6, 7], 6)],
        2: [Request(system + [8], 4), Request(list(range(10, 30)), 2)],
        3: [Request(system + [9, 9, 9], 2)],
    }
    turns = []
    for t in range(10):
        for request in arrivals.get(t, []):
            engine.add(request)
        engine.step()
        held: dict[int, list[int]] = {}
        for seq in engine.scheduler.running:
            for block in seq.blocks.table:
                held.setdefault(block, []).append(seq.id)
        turns.append({"said": list(engine.said), "waiting": [s.id for s in engine.scheduler.waiting],
                      "held": {str(b): ids for b, ids in sorted(held.items())},
                      "filed": sorted(engine.pool.idle)})  # fmt: skip
    _write(out, {"made_by": "record_paged_turns", "blocks": engine.pool.blocks,
                 "block_size": engine.pool.block_size, "turns": turns})  # fmt: skip


def draw_paged_turns(data: Path, png: Path) -> None:
    """The pool after each turn, a row a turn and a column a block: each block coloured by the
    request holding it (split between the holders of a shared block), hatched where no
    request holds it but it keeps a filed prefix; beside each row, who joined, waits or was
    preempted."""
    import re

    from matplotlib.patches import Patch, Rectangle

    r = json.loads(data.read_text())
    n, turns = r["blocks"], r["turns"]
    colours = ["#8ecae6", "#ffb703", "#2a9d8f", "#e76f51", "#b5838d"]
    fig = _figure(9.0, 0.36 * len(turns) + 1.5)
    ax = fig.subplots()
    for row, turn in enumerate(turns):
        for b in range(n):
            holders = turn["held"].get(str(b), [])
            for i, rid in enumerate(holders):  # a shared block: a stripe per holder
                h = 1 / len(holders)
                ax.add_patch(Rectangle((b, row + i * h), 1, h, facecolor=colours[rid % 5],
                                       edgecolor="white"))  # fmt: skip
            if holders:
                ax.text(b + 0.5, row + 0.5, " ".join(f"r{i}" for i in holders), ha="center",
                        va="center", fontsize=7)  # fmt: skip
            elif b in turn["filed"]:
                ax.add_patch(Rectangle((b, row), 1, 1, facecolor="white", edgecolor="0.5",
                                       hatch="///", lw=0.5))  # fmt: skip
            else:
                ax.add_patch(Rectangle((b, row), 1, 1, facecolor="white", edgecolor="0.85"))
        notes = [s for s in turn["said"] if re.search(r"joins|preempted|done", s)]
        notes = [re.sub(r" \((length|stop), \d+ tokens\)", "", s) for s in notes]
        if turn["waiting"]:
            notes.append("waiting: " + " ".join(f"r{i}" for i in turn["waiting"]))
        ax.text(n + 0.3, row + 0.5, "; ".join(notes), va="center", fontsize=7)
    ax.set_xlim(0, n + 7.5)
    ax.set_ylim(len(turns), 0)
    ax.set_xticks([b + 0.5 for b in range(n)], [str(b) for b in range(n)], fontsize=7)
    ax.set_yticks([t + 0.5 for t in range(len(turns))],
                  [f"after turn {t + 1}" for t in range(len(turns))], fontsize=7)  # fmt: skip
    ax.set_xlabel(f"block of the pool ({r['block_size']} positions each)", fontsize=8)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=colours[i], label=f"held by r{i}") for i in range(5)]
    handles.append(Patch(facecolor="white", edgecolor="0.5", hatch="///",
                         label="held by none, its prefix still filed"))  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncol=6, fontsize=7, frameon=False)
    fig.suptitle(
        f"a pool of {n} blocks shared by five requests, turn by turn (at most three running, "
        "eight prompt positions a turn)",
        fontsize=9,
    )
    fig.savefig(png, dpi=110)
