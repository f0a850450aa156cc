"""How `opscope tune` picks the next configuration to measure: a learning agent, TPE, or random search.

    searcher = make("bandit", {"threads": [1, 2], "pass_fuse": [False, True]}, seed=0, first=default)
    config = searcher.ask(); ...; searcher.tell(config, seconds)

CHOICE (the seed asks for a reinforcement-learning tuner): a contextual bandit with a learned prior --
linear Thompson sampling over the configuration's one-hot encoding, reward = -log(step seconds). Each
round the agent samples a belief of every knob value's effect from its posterior (Bayesian linear
regression) and measures the configuration that belief says is fastest. A step's time is close to
additive in its knobs' effects (a pass saves what it saves, a thread count scales the matrix ops), so
the posterior learns from every measurement about every knob, where TPE models each knob's good and bad
values apart and random search learns nothing. The prior (`prior`: knob -> value -> expected log-time
change, e.g. from the cost model) starts the agent where a model already expects the time to fall; with
no prior it starts at zero. It is a one-step (bandit) RL problem: the state does not change with the
action, so a policy over sequences would only add variance. TPE (Optuna) and random search are kept.

Every searcher asks for configurations it has not measured yet, and says so (None) when the space is spent.
"""
from __future__ import annotations

import itertools
import math
import random

import numpy as np

SEARCHES = ("bandit", "tpe", "random")


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
    """Linear Thompson sampling over one-hot knob values; reward -log(seconds)."""

    def __init__(self, space, seed=0, first=None, prior: dict | None = None, noise: float = 0.1,
                 prior_scale: float = 0.5):
        super().__init__(space, seed, first)
        self.columns = [(k, i) for k, vals in self.space.items() for i in range(len(vals))]
        n = len(self.columns) + 1                      # + the intercept
        self.mean0 = np.zeros(n)
        for j, (k, i) in enumerate(self.columns):      # the prior: expected log-time change, as a reward
            self.mean0[j] = -float((prior or {}).get(k, {}).get(self.space[k][i], 0.0))
        self.precision = np.eye(n) / prior_scale ** 2
        self.precision[-1, -1] = 1e-6                  # the intercept (the model's own speed): no prior
        self.b = self.precision @ self.mean0
        self.noise = noise
        self.np_rng = np.random.default_rng(seed)
        self.worst: float | None = None
        self.xs: list[np.ndarray] = []
        self.rewards: list[float] = []

    def _x(self, config: dict) -> np.ndarray:
        x = np.zeros(len(self.columns) + 1)
        for j, (k, i) in enumerate(self.columns):
            if repr(config.get(k)) == repr(self.space[k][i]):
                x[j] = 1.0
        x[-1] = 1.0
        return x

    def _propose(self) -> dict | None:
        cov = np.linalg.inv(self.precision)
        mean = cov @ self.b
        noise = self._noise(mean)
        for _ in range(30):
            w = self.np_rng.multivariate_normal(mean, noise ** 2 * cov, method="cholesky")
            # additive in the knobs: the best configuration under w is each knob's best value
            c = {}
            for k, vals in self.space.items():
                scores = [w[self.columns.index((k, i))] for i in range(len(vals))]
                c[k] = vals[int(np.argmax(scores))]
            if _key(c) not in self.seen:
                return c
        return self._random_unseen()

    def _noise(self, mean: np.ndarray) -> float:
        """The measurements' own scatter around the additive fit (a loaded machine's is large), never below
        the configured floor: an agent that trusts noisy times too much stops exploring."""
        if len(self.rewards) < 4:
            return self.noise
        resid = np.array(self.rewards) - np.array(self.xs) @ mean
        return max(self.noise, float(np.sqrt(np.mean(resid ** 2))))

    def tell(self, config, seconds):
        super().tell(config, seconds)
        s = self.seen[_key(config)]
        if math.isfinite(s):
            reward = -math.log(s)
            self.worst = reward if self.worst is None else min(self.worst, reward)
        else:                                          # failed or rejected: worse than anything measured
            reward = (self.worst if self.worst is not None else 0.0) - 1.0
        x = self._x(config)
        self.precision += np.outer(x, x)
        self.b += x * reward
        self.xs.append(x)
        self.rewards.append(reward)


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
