"""How `opscope tune` picks the next configuration to measure: a learning agent, TPE, or random search.

    searcher = make("bandit", {"threads": [1, 2], "pass_fuse": [False, True]}, seed=0, first=default)
    config = searcher.ask(); ...; searcher.tell(config, seconds)

CHOICE (the seed asks for a reinforcement-learning tuner): a contextual bandit with a learned prior --
linear Thompson sampling over the configuration's one-hot encoding, reward = -log(step seconds). Each
round the agent samples a belief of every knob value's effect from its posterior (Bayesian linear
regression) and measures the unmeasured configuration that belief ranks fastest. A step's time is close
to additive in its knobs' effects (a pass saves what it saves, a thread count scales the matrix ops), so
the posterior learns from every measurement about every knob, where TPE models each knob's good and bad
values apart and random search learns nothing. The prior (`prior`: knob -> value -> expected log-time
change) starts the agent where other models' measurements say the time falls: `learn_prior` fits it
from other models' tables (benchmarks/bench_tuner.py replays it on a model it never saw); its weight is
apart from the measurements' noise, so a prior that is wrong for this model is outvoted by a handful of
measurements. It is a one-step (bandit) RL problem: the state does not change with the action, so a
policy over sequences would only add variance. TPE (Optuna) and random search are kept.

Every searcher asks for configurations it has not measured yet, and says so (None) when the space is spent.
"""
from __future__ import annotations

import itertools
import math
import random

import numpy as np

SEARCHES = ("bandit", "tpe", "random")
MAX_ENUMERATED = 1 << 14       # a space up to this size: the bandit scores every configuration it has not measured


def _key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))


class _Base:
    def __init__(self, space: dict[str, list], seed: int = 0, first: dict | None = None):
        self.space = {k: list(v) for k, v in space.items()}
        self.size = math.prod(len(v) for v in self.space.values())
        self.rng = random.Random(seed)
        self.seen: dict[tuple, float] = {}
        self.first = first

    def _next_first(self) -> dict | None:
        if self.first is not None and _key(self.first) not in self.seen:
            return dict(self.first)
        return None

    def _random_unseen(self) -> dict | None:
        if len(self.seen) >= self.size:
            return None
        for _ in range(200):
            c = {k: self.rng.choice(v) for k, v in self.space.items()}
            if _key(c) not in self.seen:
                return c
        rest = [dict(zip(self.space, vals)) for vals in itertools.product(*self.space.values())]
        rest = [c for c in rest if _key(c) not in self.seen]
        return self.rng.choice(rest) if rest else None

    def ask(self) -> dict | None:
        """The first configuration, then the searcher's own proposals; None once every one was measured."""
        c = self._next_first()
        if c is not None:
            return c
        if len(self.seen) >= self.size:
            return None
        return self._propose()

    def _propose(self) -> dict | None:
        return self._random_unseen()

    def tell(self, config: dict, seconds: float | None) -> None:
        self.seen[_key(config)] = math.inf if seconds is None or not seconds > 0 else seconds


class RandomSearch(_Base):
    """Uniform over the configurations not measured yet."""


class TPESearch(_Base):
    """Optuna's TPE, told every measurement (its own and the first) through ask/tell."""

    def __init__(self, space, seed=0, first=None):
        super().__init__(space, seed, first)
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
        self.dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in self.space.items()}
        self.pending: dict[tuple, object] = {}

    def _propose(self) -> dict | None:
        for _ in range(50):                 # TPE repeats itself on small spaces: tell it what it already knows
            trial = self.study.ask(self.dists)
            c = dict(trial.params)
            if _key(c) in self.seen:
                self.study.tell(trial, self.seen[_key(c)] if math.isfinite(self.seen[_key(c)]) else 1e9)
                continue
            self.pending[_key(c)] = trial
            return c
        return self._random_unseen()

    def tell(self, config, seconds):
        super().tell(config, seconds)
        import optuna
        trial = self.pending.pop(_key(config), None)
        value = self.seen[_key(config)]
        value = value if math.isfinite(value) else 1e9
        if trial is not None:
            self.study.tell(trial, value)
        else:                               # the first configuration, or one asked elsewhere
            self.study.add_trial(optuna.trial.create_trial(params=config, distributions=self.dists, value=value))


class BanditSearch(_Base):
    """Linear Thompson sampling over one-hot knob values; reward -log(seconds).

    Bayesian linear regression with the prior's variance apart from the measurements' noise: each knob
    value's effect starts at N(prior, prior_scale^2), the measurements count with the noise estimated from
    their own scatter around the fit. So the prior picks the first configurations, and a few measurements
    that contradict it win."""

    def __init__(self, space, seed=0, first=None, prior: dict | None = None, noise: float = 0.05,
                 prior_scale: float = 0.3):
        super().__init__(space, seed, first)
        self.columns = [(k, i) for k, vals in self.space.items() for i in range(len(vals))]
        n = len(self.columns) + 1                      # + the intercept
        self.mean0 = np.zeros(n)
        scale = np.full(n, prior_scale)
        for j, (k, i) in enumerate(self.columns):      # the prior: expected log-time change, as a reward
            self.mean0[j] = -float((prior or {}).get(k, {}).get(self.space[k][i], 0.0))
        scale[-1] = 1e3                                # the intercept (the model's own speed): no prior
        self.prior_precision = np.diag(1.0 / scale ** 2)
        self.noise = noise
        self.np_rng = np.random.default_rng(seed)
        self.worst: float | None = None
        self.xs: list[np.ndarray] = []
        self.rewards: list[float] = []
        self._all: list[dict] | None = None

    def _x(self, config: dict) -> np.ndarray:
        x = np.zeros(len(self.columns) + 1)
        for j, (k, i) in enumerate(self.columns):
            if repr(config.get(k)) == repr(self.space[k][i]):
                x[j] = 1.0
        x[-1] = 1.0
        return x

    def posterior(self, noise: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, covariance) of the knob values' effects given the measurements so far."""
        sigma2 = (noise or self.noise) ** 2
        x = np.array(self.xs).reshape(len(self.xs), len(self.mean0))
        precision = self.prior_precision + x.T @ x / sigma2
        cov = np.linalg.inv(precision)
        return cov @ (self.prior_precision @ self.mean0 + x.T @ np.array(self.rewards) / sigma2), cov

    def _noise(self) -> float:
        """The measurements' own scatter around the additive fit (a loaded machine's is large), never below
        the configured floor: an agent that trusts noisy times too much stops exploring."""
        if len(self.rewards) < 4:
            return self.noise
        mean, _ = self.posterior()
        resid = np.array(self.rewards) - np.array(self.xs) @ mean
        return max(self.noise, float(np.sqrt(np.mean(resid ** 2))))

    def _propose(self) -> dict | None:
        mean, cov = self.posterior(self._noise())
        w = self.np_rng.multivariate_normal(mean, cov, method="cholesky")
        if self.size <= MAX_ENUMERATED:
            # Thompson sampling proper: the unmeasured configuration the sampled belief ranks first (once the
            # belief is sure of the best, the next best it has not measured, never a random one)
            if self._all is None:
                self._all = [dict(zip(self.space, vals)) for vals in itertools.product(*self.space.values())]
                self._all_x = np.array([self._x(c) for c in self._all])
            scores = self._all_x @ w
            for j in np.argsort(-scores, kind="stable"):
                if _key(self._all[j]) not in self.seen:
                    return dict(self._all[j])
            return None
        for _ in range(30):
            # additive in the knobs: the best configuration under w is each knob's best value
            c = {}
            for k, vals in self.space.items():
                scores = [w[self.columns.index((k, i))] for i in range(len(vals))]
                c[k] = vals[int(np.argmax(scores))]
            if _key(c) not in self.seen:
                return c
            w = self.np_rng.multivariate_normal(mean, cov, method="cholesky")
        return self._random_unseen()

    def tell(self, config, seconds):
        super().tell(config, seconds)
        s = self.seen[_key(config)]
        if math.isfinite(s):
            reward = -math.log(s)
            self.worst = reward if self.worst is None else min(self.worst, reward)
        else:                                          # failed or rejected: worse than anything measured
            reward = (self.worst if self.worst is not None else 0.0) - 1.0
        self.xs.append(self._x(config))
        self.rewards.append(reward)


def learn_prior(measured: list[list[tuple[dict, float | None]]], ridge: float = 1.0) -> dict:
    """A prior for the bandit learned from other models' measurements: for each model, a ridge fit of log
    step seconds on its configurations' one-hot knob values (each knob's effects centred on zero: the
    intercept is that model's own speed), then each knob value's effect averaged over the models that had
    it. knob -> value -> expected log-time change, as BanditSearch's `prior` takes it. A pass that saves
    time on most models is then tried first on a new one, and the agent unlearns it where it does not."""
    sums: dict[tuple, list[float]] = {}
    values: dict[str, list] = {}
    for rows in measured:
        rows = [(c, s) for c, s in rows if s is not None and s > 0]
        if len(rows) < 2:
            continue
        cols = sorted({(k, repr(v)) for c, _ in rows for k, v in c.items()})
        for c, _ in rows:
            for k, v in c.items():
                if v not in values.setdefault(k, []):
                    values[k].append(v)
        x = np.array([[1.0] + [float(repr(c.get(k)) == v) for k, v in cols] for c, _ in rows])
        y = np.log([s for _, s in rows])
        reg = ridge * np.eye(x.shape[1])
        reg[0, 0] = 0.0                                # the model's own speed: not shrunk
        w = np.linalg.solve(x.T @ x + reg, x.T @ y)[1:]
        for k in {k for k, _ in cols}:
            idx = [j for j, (kk, _) in enumerate(cols) if kk == k]
            centre = float(np.mean(w[idx]))
            for j in idx:
                sums.setdefault(cols[j], []).append(float(w[j]) - centre)
    return {k: {v: float(np.mean(sums[(k, repr(v))])) for v in vals if (k, repr(v)) in sums}
            for k, vals in values.items()}


def check(search: str) -> str:
    """`search` when it names a searcher; one line otherwise (tune checks it before the model loads)."""
    if search not in SEARCHES:
        from opscope.runtime.errors import UsageError
        raise UsageError(f"--search {search}: give one of {', '.join(SEARCHES)}")
    return search


def make(search: str, space: dict[str, list], *, seed: int = 0, first: dict | None = None,
         prior: dict | None = None):
    if check(search) == "bandit":
        return BanditSearch(space, seed, first, prior)
    return (TPESearch if search == "tpe" else RandomSearch)(space, seed, first)
