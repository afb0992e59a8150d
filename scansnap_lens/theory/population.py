"""Attention predicted from corpus statistics alone: the paper's population dynamics.

The Y/Z model of Lemma 1 at T -> infinity (Lemma 2), trained by the optimizer a model used, on
the expected loss of a set of classes (m, n): each with its context distribution P(l|m, n) and
its weight, the share of the training loss its events carry.  Nothing here looks at a model:
the input is a `CooccurrenceStats` (or the lab's `SequenceClasses`) and the rates.

    pop = Population.from_stats(stats, classes=[(m, n), ...])
    run = predict(pop, lr_y=0.1, lr_z=3.0, steps=traj.steps)   # Z [S, Q, U] over training
    run.attention()                                           # c(t) [S, K, U] of Eq. 5
    predicted = run.to_trajectory(traj.plan)                  # measured like any trajectory

Shape letters: S steps, K classes, Q query tokens of the classes, C context tokens (the union
of the classes' supports), O output rows (the classes' next tokens and one row for the rest).

The vocabulary is compressed, and the compression is exact: Z[m, l] and Y[:, l] of a token l
outside every support get no gradient, and the output tokens that are no class's next token
start equal and get equal gradients, so they stay equal and are one row of Y that enters the
softmax with multiplicity M - (O - 1).  With zero initialisation (the paper's) a run on
`Population.from_classes(classes)` equals `yz.train_yz(classes, population=True)` (tested).

>>> from scansnap_lens.lab.synthetic import syn_small
>>> pop = Population.from_classes(syn_small())
>>> run = predict(pop, lr_y=1.0, lr_z=1.0, steps=[0, 10, 100])
>>> run.Z.shape, run.attention().shape   # [S, Q, U], [S, K, U]
(torch.Size([3, 2, 30]), torch.Size([3, 2, 30]))
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

__all__ = ["Population", "PopulationRun", "predict"]


@dataclass(frozen=True)
class Population:
    """Classes k = (query[k], next_token[k]) with weight[k] (their share of the training loss),
    and their context distributions P(l|m, n), stored sparse: one triple per (k, l) in the
    support, l = tokens[triple_column], over the context ids `tokens` [U] (ascending) of a
    vocabulary of M = `vocab_size` tokens.  `probs` gives them dense, [K, U]."""

    query: Tensor  # [K]
    next_token: Tensor  # [K]
    weight: Tensor  # [K] float64
    triple_class: Tensor  # [T] ascending
    triple_column: Tensor  # [T]
    triple_p: Tensor  # [T] float64, > 0, summing to 1 within each class
    tokens: Tensor  # [U]
    vocab_size: int

    def __post_init__(self) -> None:
        K = self.query.numel()
        if K == 0:
            raise ValueError("a population needs at least one class")
        if (self.weight <= 0).any():
            raise ValueError("class weights must be positive")
        if (self.triple_p <= 0).any():
            raise ValueError("triples hold the support: every P(l|m, n) must be positive")
        held = torch.unique(self.triple_class).numel()
        if held != K:
            raise ValueError(
                f"every class needs at least one context token, and {K - held} of {K} have none"
                " in the statistics (counted with another window=, or pruned?): count them"
                " with the recording's window"
            )

    @classmethod
    def from_dense(cls, query, next_token, weight, probs, tokens, vocab_size) -> Population:
        """From probs [K, U] over `tokens` [U] (rows summing to 1)."""
        probs = torch.as_tensor(probs, dtype=torch.float64)
        if probs.shape != (len(query), len(tokens)):
            raise ValueError(f"probs must be [K={len(query)}, U={len(tokens)}]")
        k, col = (probs > 0).nonzero(as_tuple=True)
        return cls(
            torch.as_tensor(query),
            torch.as_tensor(next_token),
            torch.as_tensor(weight, dtype=torch.float64),
            k,
            col,
            probs[k, col],
            torch.as_tensor(tokens),
            vocab_size,
        )

    @property
    def probs(self) -> Tensor:
        """[K, U] P(l|m, n), dense."""
        dense = torch.zeros(self.num_classes, self.tokens.numel(), dtype=torch.float64)
        dense[self.triple_class, self.triple_column] = self.triple_p
        return dense

    @property
    def num_classes(self) -> int:
        return self.query.numel()

    @property
    def queries(self) -> Tensor:
        """[Q] the distinct query tokens, ascending."""
        return torch.unique(self.query)

    @classmethod
    def from_stats(
        cls,
        stats,
        classes: Iterable[tuple[int, int]] | None = None,
        loss_positions: int | None = None,
        vocab_size: int | None = None,
    ) -> Population:
        """The classes (m, n) of `stats` (all, or those given that occur), P(l|m, n) from the
        counts, and weight N(m, n) / `loss_positions`: the number of positions the training
        loss averages over in the counted corpus.  Default: every next-token prediction,
        ``num_tokens - num_rows`` (a language model's loss); a model trained on the last
        position of each row only (the demo) passes ``stats.num_rows``.  `vocab_size`: the
        model's output vocabulary M when it is larger than the statistics' (a padded d_vocab)."""
        V = stats.vocab_size
        if vocab_size is not None and vocab_size < V:
            raise ValueError(f"vocab_size {vocab_size} is below the statistics' {V}")
        keys = stats.query * V + stats.next_token
        if classes is None:
            index = torch.arange(stats.num_classes)
        else:
            wanted = torch.tensor([int(m) * V + int(n) for m, n in classes], dtype=torch.long)
            index = torch.isin(keys, wanted).nonzero().flatten()
            if index.numel() == 0:
                raise ValueError(
                    "none of the classes (m, n) occurs in the statistics: count them on the"
                    " corpus the model was trained on, with the same tokenizer"
                )
        positions = loss_positions or (stats.num_tokens - stats.num_rows)
        if positions <= 0:
            raise ValueError(f"loss_positions must be positive, got {positions}")
        triple_class = stats.triple_class
        keep = torch.isin(triple_class, index) & (stats.count > 0)
        tokens, column = torch.unique(stats.token[keep], return_inverse=True)
        row = torch.searchsorted(index, triple_class[keep])
        order = torch.argsort(row * tokens.numel() + column)
        row, column, counts = row[order], column[order], stats.count[keep][order].double()
        total = torch.zeros(index.numel(), dtype=torch.float64).index_add_(0, row, counts)
        if (total == 0).any():
            raise ValueError("a class has no context tokens left (pruned statistics?)")
        return cls(
            query=stats.query[index].clone(),
            next_token=stats.next_token[index].clone(),
            weight=stats.events[index].double() / positions,
            triple_class=row,
            triple_column=column,
            triple_p=counts / total[row],
            tokens=tokens,
            vocab_size=vocab_size or V,
        )

    @classmethod
    def from_classes(cls, classes) -> Population:
        """The lab's `SequenceClasses`: uniform weights 1/K (the population loss's mean)."""
        tokens = classes.support().any(0).nonzero().flatten()
        K = classes.num_classes
        return cls.from_dense(
            classes.query.clone(),
            classes.next_token.clone(),
            torch.full((K,), 1.0 / K, dtype=torch.float64),
            classes.probs[:, tokens].double(),
            tokens,
            classes.vocab_size,
        )

    @classmethod
    def of(
        cls, source, classes=None, loss_positions: int | None = None, vocab_size=None
    ) -> Population:
        """`from_stats` for `CooccurrenceStats`, `from_classes` for `SequenceClasses`, and a
        `Population` as it is."""
        if isinstance(source, Population):
            return source
        if hasattr(source, "probs") and hasattr(source, "sample"):
            return cls.from_classes(source)
        if hasattr(source, "events") and hasattr(source, "offsets"):
            return cls.from_stats(source, classes, loss_positions, vocab_size)
        raise TypeError(
            f"expected CooccurrenceStats, SequenceClasses or Population, got {type(source)}"
        )


def _segment_softmax(logits: Tensor, segment: Tensor, K: int) -> Tensor:
    """Softmax of `logits` [..., T] within each segment (class) of `segment` [T], K classes."""
    shape = (*logits.shape[:-1], K)
    index = segment.expand_as(logits)
    top = torch.full(shape, -math.inf, dtype=logits.dtype).scatter_reduce(
        -1, index, logits.detach(), "amax"
    )  # a shift for stability; softmax does not depend on it
    e = torch.exp(logits - top.gather(-1, index))
    total = torch.zeros(shape, dtype=logits.dtype).scatter_add(-1, index, e)
    return e / total.gather(-1, index)


@dataclass
class PopulationRun:
    """A population run: Z [S, Q, U] (logits of each query of `population.queries` over its
    `population.tokens`) at `steps` [S], the loss [S] there, and the `training` settings."""

    population: Population
    steps: Tensor
    Z: Tensor
    loss: Tensor
    training: dict

    def attention_triples(self) -> Tensor:
        """c[l|n] of Eq. 5 on the population's triples: [S, T]."""
        pop = self.population
        q = torch.searchsorted(pop.queries, pop.query)[pop.triple_class]
        logits = self.Z[:, q, pop.triple_column] + pop.triple_p.log()
        return _segment_softmax(logits, pop.triple_class, pop.num_classes)

    def attention(self) -> Tensor:
        """c[l|n] of Eq. 5 for every class, dense: [S, K, U]."""
        pop = self.population
        out = torch.zeros(
            self.steps.numel(), pop.num_classes, pop.tokens.numel(), dtype=self.Z.dtype
        )
        out[:, pop.triple_class, pop.triple_column] = self.attention_triples()
        return out

    def to_trajectory(self, plan):
        """The prediction as a one-head `Trajectory` on `plan`'s slots: zbar of a pair (m, l)
        is Z[m, l] (0 where the statistics never put l in a context of m: it never moves),
        c_hat of a (class, token) outside the statistics' support is 0, and NaN for a class the
        population lacks."""
        from scansnap_lens.recording.trajectory import Trajectory

        pop = self.population
        q_pos = torch.searchsorted(pop.queries, plan.pair_query).clamp_max(pop.queries.numel() - 1)
        t_pos = torch.searchsorted(pop.tokens, plan.pair_token).clamp_max(pop.tokens.numel() - 1)
        held = (pop.queries[q_pos] == plan.pair_query) & (pop.tokens[t_pos] == plan.pair_token)
        zbar = torch.where(held, self.Z[:, q_pos, t_pos], torch.zeros((), dtype=self.Z.dtype))

        V = plan.vocab_size
        pop_keys = pop.query * V + pop.next_token
        order = torch.argsort(pop_keys)
        sorted_keys = pop_keys[order]
        k_pos = torch.searchsorted(sorted_keys, plan.class_keys).clamp_max(pop.num_classes - 1)
        k_held = sorted_keys[k_pos] == plan.class_keys  # [C_plan]
        k_of = order[k_pos][plan.triple_class]  # [Pc] the population class of each c_hat slot
        col = torch.searchsorted(pop.tokens, plan.triple_token).clamp_max(pop.tokens.numel() - 1)
        col_held = pop.tokens[col] == plan.triple_token
        C = pop.tokens.numel()
        keys = pop.triple_class * C + pop.triple_column  # ascending
        wanted = k_of * C + col
        t = torch.searchsorted(keys, wanted).clamp_max(keys.numel() - 1)
        found = (keys[t] == wanted) & col_held & k_held[plan.triple_class]
        c_hat = torch.where(
            found, self.attention_triples()[:, t], torch.zeros((), dtype=zbar.dtype)
        )
        c_hat[:, ~k_held[plan.triple_class]] = math.nan
        return Trajectory(
            plan,
            self.steps.clone(),
            layers=[0],
            heads=[0],
            zbar=zbar[:, None, None].float(),
            c_hat=c_hat[:, None, None].float(),
            meta={"source": "population prediction", **self.training},
        )


def _loss(Y: Tensor, Z: Tensor, pop: Population, q: Tensor, target: Tensor, log_mult: Tensor):
    """sum_k weight_k CE(Y f_k + log multiplicity, target_k), f_k = c_k / ||c_k|| (Lemma 2),
    and the attention c [T] of every triple."""
    K, C = pop.num_classes, pop.tokens.numel()
    logits = Z[q[pop.triple_class], pop.triple_column] + pop.triple_p.log()  # [T]
    c = _segment_softmax(logits, pop.triple_class, K)
    norm = torch.zeros(K, dtype=c.dtype).index_add(0, pop.triple_class, c * c).sqrt()
    f = c / norm[pop.triple_class]
    F_ = torch.sparse_coo_tensor(
        torch.stack([pop.triple_class, pop.triple_column]), f, (K, C), check_invariants=False
    )
    out = torch.sparse.mm(F_, Y.T) + log_mult  # [K, O]
    return (F.cross_entropy(out, target, reduction="none") * pop.weight).sum(), c.detach()


# the classes the report's theory fit integrates by default, the most frequent: a gradient
# costs triples x next tokens, both growing with the classes (a user's 7,913: hours; 128 on
# WikiText with a 64-token window: 26 s for 800 steps on 2 cores)
THEORY_CLASSES = 128
# the theory fit's time at most by default: a report in about a minute on 2 cores
THEORY_SECONDS = 20.0
EXACT_STEPS = 256  # optimizer steps taken one by one before steps are merged
ERROR = 2e-5  # the largest error of the attention (a probability) one merged step may make
# A merged step is at least 1/RESOLUTION of the steps taken: at most about RESOLUTION x log2
# gradients from step EXACT_STEPS to any last step, wherever the error keeps h small (a
# population that never settles: uniform tokens at high rates).
RESOLUTION = 128


def predict(
    population: Population,
    lr_y: float,
    lr_z: float,
    steps: Sequence[int] | Tensor,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    dtype: torch.dtype = torch.float64,
    progress: bool = False,
    exact: bool = False,
    announce: bool = True,
) -> PopulationRun:
    """Train the population Y/Z model from zero (the paper's start) with the optimizer the model
    used (PyTorch's SGD with `momentum`, or Adam with `betas`, `eps`) at the rates `lr_y`
    (decoder Y) and `lr_z` (attention Z), keeping Z at `steps` (checkpoint steps, ascending).

    The first `EXACT_STEPS` optimizer steps are taken one by one; after them, runs of h steps
    are merged into one (the update held for h steps: SGD's momentum summed in closed form,
    Adam's moments decayed h times, its update taken at the span's middle).  A merged step's
    error is about h times how much the attention's rate of change changed over it (explicit
    Euler's local error, on what the fit compares): h doubles while that stays under a quarter
    of `ERROR` and halves past it, never below 1/`RESOLUTION` of the step reached; every
    checkpoint step is hit exactly.  The work grows with the log of the last step, not with the
    step: a checkpoint at step 10^12 takes at most about 5,000 gradients.  ``exact=True``: every
    step one by one (the reference the merged steps are tested against).  With `progress`, the
    cost is said at the second gradient (`announce`) and the bar counts gradients, so its
    estimate is measured again as it goes.

    Cost per gradient: O(T x O) for T triples and O output rows (sparse), not K x C x O."""
    steps_t = _checked(steps, lr_y, lr_z, optimizer)
    pop = replace(
        population, weight=population.weight.to(dtype), triple_p=population.triple_p.to(dtype)
    )
    q = torch.searchsorted(pop.queries, pop.query)
    outputs, target, mult = _output_rows(pop, dtype)
    Y = torch.zeros(mult.numel(), pop.tokens.numel(), dtype=dtype, requires_grad=True)
    Z = torch.zeros(pop.queries.numel(), pop.tokens.numel(), dtype=dtype, requires_grad=True)
    rates = (lr_y, lr_z)
    state = [[torch.zeros_like(p), torch.zeros_like(p)] for p in (Y, Z)]
    wanted = steps_t.tolist()
    snaps, losses = [], []
    # the optimizer step reached, steps per update, next checkpoint, gradients taken
    step, h, at, gradients = 0, 1, 0, 0
    last = None  # (attention, its rate of change per step, the steps since the one before)
    # made once the cost is said: `tqdm.write` redraws an open bar before its delay is up,
    # and a bar never redrawn after that ends without its newline
    bar = None
    started = time.perf_counter()
    while True:
        loss, attention = _loss(Y, Z, pop, q, target, mult.log())
        if step == wanted[at]:
            snaps.append(Z.detach().clone())
            losses.append(float(loss.detach()))
            at += 1
            if at == len(wanted):
                break
        if not exact and step >= EXACT_STEPS and last is not None and last[1] is not None:
            h = _merged_steps(h, step, attention, last)
        gy, gz = torch.autograd.grad(loss, (Y, Z))
        gy = gy / mult[:, None]  # the rest row stands for `rest` rows, each with its own share
        n = 1 if exact or step < EXACT_STEPS else min(h, wanted[at] - step)
        with torch.no_grad():
            for p, g, rate_, moments in zip((Y, Z), (gy, gz), rates, state):
                p.sub_(rate_ * held_steps(optimizer, moments, g, step, n, momentum, betas, eps))
        gradients += 1
        if bar is None and (step == 1 or not progress):  # the second: the first warms up
            seconds = time.perf_counter() - started if progress and announce else None
            bar = _gradient_bar(pop, outputs.numel(), wanted, exact, gradients, progress, seconds)
        started = time.perf_counter()
        last = (attention, None if last is None else (attention - last[0]) / last[2], n)
        step += n
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.total = bar.n  # fewer than at most: the merged steps grew where the error allowed
        bar.close()
    training = {"lr_y": lr_y, "lr_z": lr_z, "optimizer": optimizer, "momentum": momentum}
    return PopulationRun(
        population,
        steps_t,
        torch.stack(snaps).double(),
        torch.tensor(losses, dtype=torch.float64),
        training,
    )


def _gradient_bar(
    pop,
    outputs: int,
    wanted: list[int],
    exact: bool,
    gradients: int,
    progress: bool,
    seconds: float | None,
):
    """`predict`'s progress bar over gradients (shown with `progress`), the cost said first
    where a gradient's `seconds` are given."""
    if seconds is not None:
        _say_cost(pop, outputs, wanted, seconds, exact)
    return tqdm(
        total=gradients_at_most(wanted[-1], len(wanted), exact),
        initial=gradients - 1,
        desc="population dynamics",
        unit="gradient",
        disable=not progress,
        delay=2,
    )


def _checked(steps, lr_y: float, lr_z: float, optimizer: str) -> Tensor:
    """[S] `predict`'s steps, once its inputs are checked."""
    steps_t = torch.as_tensor(steps, dtype=torch.long).flatten()
    if steps_t.numel() == 0 or (steps_t < 0).any() or (torch.diff(steps_t) <= 0).any():
        raise ValueError("steps must be non-negative and strictly ascending")
    if not (lr_y > 0 and lr_z > 0 and math.isfinite(lr_y) and math.isfinite(lr_z)):
        raise ValueError(f"rates must be positive and finite, got lr_y={lr_y}, lr_z={lr_z}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    return steps_t


def _output_rows(pop: Population, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(outputs [O], each class's output row [K], rows' multiplicities [O or O + 1]): the
    decoder's rows, the classes' next tokens and one row standing for every other token of
    the vocabulary (its multiplicity their number)."""
    outputs, target = torch.unique(pop.next_token, return_inverse=True)
    rest = pop.vocab_size - outputs.numel()
    mult = torch.ones(outputs.numel() + (rest > 0), dtype=dtype)
    if rest > 0:
        mult[-1] = rest
    return outputs, target, mult


def _merged_steps(h: int, step: int, attention: Tensor, last: tuple) -> int:
    """The next merged step's length from the last one's error: the last merged step held its
    update fixed, so its error is about its length times how much the attention's rate of
    change changed over it (Euler's local error).  last: (attention, its rate, the length)."""
    rate = (attention - last[0]) / last[2]
    error = last[2] * float((rate - last[1]).abs().max())
    h = 2 * h if error < ERROR / 4 else max(1, h // 2) if error > ERROR else h
    return max(h, step // RESOLUTION)


def gradients_at_most(last_step: int, checkpoints: int, exact: bool = False) -> int:
    """How many gradients `predict` takes at the most to reach `last_step`."""
    if exact or last_step <= EXACT_STEPS:
        return last_step + 1
    merged = RESOLUTION * math.log2(last_step / EXACT_STEPS) + RESOLUTION
    return EXACT_STEPS + math.ceil(merged) + checkpoints


def _say_cost(pop: Population, outputs: int, wanted: list, seconds: float, exact: bool) -> None:
    from scansnap_lens.recording.budget import duration

    most = gradients_at_most(wanted[-1], len(wanted), exact)
    tqdm.write(
        f"population dynamics: {pop.num_classes:,} classes, {pop.triple_p.numel():,} triples,"
        f" {outputs:,} next tokens; a gradient takes {duration(seconds)}: at most"
        f" {most:,} gradients to step {wanted[-1]:,}, about {duration(seconds * most)}"
    )


def held_steps(
    optimizer: str,
    moments: list[Tensor],
    g: Tensor,
    step: int,
    n: int,
    momentum: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> Tensor:
    """The sum of the updates of `n` steps of PyTorch's "sgd" (with `momentum`) or "adam"
    from optimizer step `step` (0 first) with the gradient `g` held, the parameter's
    `moments` [m1, m2] updated in place; n = 1: one step exactly as ``torch.optim`` takes it."""
    if optimizer == "sgd":
        return _sgd_steps(moments[0], g, momentum, n)
    return _adam_steps(moments[0], moments[1], g, betas, eps, step, n)


def _sgd_steps(m: Tensor, g: Tensor, beta: float, n: int) -> Tensor:
    """The sum of the momentum buffer over `n` SGD steps with the gradient `g` held (PyTorch's
    m <- beta m + g, p <- p - lr m), in closed form; `m` is updated in place."""
    if beta == 0.0:
        m.copy_(g)
        return g * n
    decay = beta**n
    geometric = beta * (1 - decay) / (1 - beta)  # sum over j = 1..n of beta^j
    total = m * geometric + g * (n - geometric) / (1 - beta)
    m.mul_(decay).add_(g, alpha=(1 - decay) / (1 - beta))
    return total


def _adam_steps(m1, m2, g, betas, eps, step: int, n: int) -> Tensor:
    """The sum of the updates of `n` Adam steps from optimizer step `step` with the gradient
    `g` held: the moments decay n times (`m1`, `m2` updated in place), and the sum is n times
    the update at the span's middle (the midpoint rule: the moments still drift, v with a
    memory of a thousand steps)."""
    b1, b2 = betas[0], betas[1]
    if n == 1:
        m1.mul_(b1).add_(g, alpha=1 - b1)
        m2.mul_(b2).addcmul_(g, g, value=1 - b2)
        t = step + 1
        return (m1 / (1 - b1**t)) / ((m2 / (1 - b2**t)).sqrt() + eps)
    half = n / 2
    m_mid = m1 * b1**half + g * (1 - b1**half)
    v_mid = m2 * b2**half + g * g * (1 - b2**half)
    t = step + half
    change = n * (m_mid / (1 - b1**t)) / ((v_mid / (1 - b2**t)).sqrt() + eps)
    m1.mul_(b1**n).add_(g, alpha=1 - b1**n)
    m2.mul_(b2**n).addcmul_(g, g, value=1 - b2**n)
    return change
