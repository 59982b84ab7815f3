"""Label-set book-keeping shared by collectors that export kernel map entries.

Map entries come and go (a cgroup is removed, its entries are deleted), but an
exported counter must never go backwards while its label set is in use, and
the number of label sets must stay bounded. SeriesBook keeps both promises:

- the final values of deleted entries ("retired") are added to a base that is
  exported with the label set: once more if nothing else uses it (the last
  export), or for as long as live entries share it (a new cgroup at the same
  path continues the counter instead of resetting it);
- at most `max_series` label sets are admitted; the rest are folded into
  one overflow label set whose counters only grow. First come, first served,
  but for the label sets `keeps` names (a scheduler's job, a pod, a VM): one
  of those is admitted whenever it comes, in the place of one that is not,
  which folds (its counters go on in overflow), so a user who makes label
  sets first cannot push a later job into overflow. Only when every
  admitted set is kept does a kept one pass the cap: their number is the
  scheduler's, not a user's.

Samples are any objects with a `merge(other)` method and a zero-argument
constructor (`factory`). The live samples handed to `scrape` are adopted,
not copied: the caller builds them fresh for each scrape. Retired values
may come between scrapes (`retire`, on the agent's own schedule): each is
exported by the next scrape, whenever that is.
"""
from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

Labels = tuple
S = TypeVar("S")


class SeriesBook(Generic[S]):
    def __init__(self, factory: Callable[[], S], overflow: Labels, max_series: int = 0,
                 keeps: Callable[[Labels], bool] = lambda labels: False):
        self.factory = factory
        self.overflow = overflow
        self.max_series = max_series      # 0: no limit
        self.keeps = keeps
        # insertion-ordered: the oldest set that is not kept folds first
        self._admitted: dict[Hashable, None] = {}
        self._folded: set[Hashable] = set()
        self._base: dict[Hashable, S] = {}
        # label sets retired into since the last scrape: it exports them once more
        self._pending: set[Hashable] = set()
        self.folded_total = 0             # label sets ever sent to overflow

    def admit(self, labels: Labels) -> Labels:
        """The label set to count `labels` under: itself, or overflow."""
        if labels in self._admitted or labels == self.overflow:
            return labels
        if not self.max_series or len(self._admitted) < self.max_series:
            self._admitted[labels] = None
            return labels
        if self.keeps(labels):
            self._fold_one_not_kept()
            self._admitted[labels] = None
            self._folded.discard(labels)
            return labels
        if labels not in self._folded:
            self._folded.add(labels)
            self.folded_total += 1
        return self.overflow

    def _fold_one_not_kept(self) -> None:
        """Make room for a kept set: the oldest admitted set that is not kept
        folds into overflow, with the base it had."""
        victim = next((labels for labels in self._admitted if not self.keeps(labels)), None)
        if victim is None:
            return
        del self._admitted[victim]
        self._folded.add(victim)
        self.folded_total += 1
        base = self._base.pop(victim, None)
        if base is not None:
            into = self._base.get(self.overflow)
            if into is None:
                into = self._base[self.overflow] = self.factory()
            into.merge(base)
        self._pending.discard(victim)

    def retire(self, retired: dict[Labels, S]) -> None:
        """The final values of entries just deleted from the map: added to
        their label set's base, which the next scrape exports."""
        for labels, sample in retired.items():
            key = self.admit(labels)
            base = self._base.get(key)
            if base is None:
                base = self._base[key] = self.factory()
            base.merge(sample)
            self._pending.add(key)
            if key == self.overflow:
                self._folded.discard(labels)

    def scrape(self, live: dict[Labels, S]) -> dict[Labels, S]:
        """Label set -> sample to export now: `live` are the current values of
        entries still in the map, and what `retire` was given since the last
        scrape is exported once more."""
        out: dict[Labels, S] = {}
        just_retired, self._pending = self._pending, set()
        in_use = set()
        for labels, sample in live.items():
            key = self.admit(labels)
            in_use.add(key)
            merged = out.get(key)
            if merged is None:
                out[key] = sample
            else:
                merged.merge(sample)
        for key, base in list(self._base.items()):
            if key in in_use or key in just_retired or key == self.overflow:
                merged = out.get(key)
                if merged is None:
                    merged = out[key] = self.factory()
                merged.merge(base)
            else:
                # exported once after its last entry went away: forget it
                del self._base[key]
                self._admitted.pop(key, None)
        # admitted label sets with neither entries nor base are gone too
        for key in [k for k in self._admitted if k not in in_use and k not in self._base]:
            del self._admitted[key]
        return out

    @property
    def series(self) -> int:
        return len(self._admitted) + (1 if self.overflow in self._base or self._folded else 0)
