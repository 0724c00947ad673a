"""Model-based test: the real catalog against a dictionary, under an injected clock.

Rules commit, pin/unpin, load, advance the clock past TTLs, prune (ids, filters, all; dry run
or not; with busy states), reconcile and read, for two principals. The model keeps what is *on
disk*: expired states stay until the next mutation removes them, exactly like the store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
from pathlib import Path

from _crash_child import P_OTHER, envelope, fingerprint, read_payload
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from werk.protocol.errors import NotFound
from werk.protocol.states import PruneFilter, PruneRequest, PruneSkip, SkipReason, Tier
from werk.state.catalog import StateCatalog
from werk.state.metadata import principal_dir_name

PRINCIPALS = st.sampled_from(["local", P_OTHER])
MODELS = st.sampled_from(["m1", "m2"])
TIERS = st.sampled_from([Tier.DISK, Tier.RAM])


@dataclasses.dataclass
class Model:
    principal: str
    model: str
    tier: Tier
    fp: int
    created_at: float
    expires_at: float | None
    pinned: bool
    data: bytes
    last_accessed_at: float | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class CatalogMachine(RuleBasedStateMachine):
    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="werk-catalog-"))
        self.now = 1_700_000_000.0
        self.catalog = StateCatalog(self.tmp / "home", clock=lambda: self.now)
        self.states: dict[str, Model] = {}
        self.busy: dict[str, SkipReason] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- model helpers ------------------------------------------------------------------------

    def _mutation(self, principal: str) -> None:
        """Every mutation reconciles its principal first: that principal's expired states
        leave the disk. (Other principals' expired states leave it at their own next mutation
        or at a whole-store pass, whose timing the model does not predict: see
        :meth:`_sync_expired`.)"""
        for sid in [
            s for s, m in self.states.items() if m.principal == principal and m.expired(self.now)
        ]:
            del self.states[sid]

    def _sync_expired(self) -> None:
        """Forget expired states that an earlier whole-store pass already deleted (expired
        states are invisible to reads either way; only a deletion is learned from the disk)."""
        store = self.tmp / "home" / "runtime-state" / "v1"
        for sid, m in list(self.states.items()):
            if m.expired(self.now) and not (store / principal_dir_name(m.principal) / sid).exists():
                del self.states[sid]

    def _live(self, principal: str) -> list[tuple[str, Model]]:
        rows = [
            (sid, m)
            for sid, m in self.states.items()
            if m.principal == principal and not m.expired(self.now)
        ]
        return sorted(rows, key=lambda r: (r[1].created_at, r[0]))

    def _on_disk(self, principal: str) -> list[tuple[str, Model]]:
        rows = [(sid, m) for sid, m in self.states.items() if m.principal == principal]
        return sorted(rows, key=lambda r: (r[1].created_at, r[0]))

    # -- rules ----------------------------------------------------------------------------------

    @rule(
        target=ids,
        principal=PRINCIPALS,
        model=MODELS,
        tier=TIERS,
        fp=st.integers(0, 2),
        ttl=st.sampled_from([None, 5, 30]),
        pinned=st.booleans(),
        data=st.binary(max_size=2048),
    )
    def commit(
        self,
        principal: str,
        model: str,
        tier: Tier,
        fp: int,
        ttl: int | None,
        pinned: bool,
        data: bytes,
    ) -> str:
        self._mutation(principal)
        state = self.catalog.commit(
            principal,
            envelope=envelope(principal),
            model=model,
            backend="test",
            tier=tier,
            fingerprint=fingerprint(fp),
            payload=[data[: len(data) // 2], data[len(data) // 2 :]],
            ttl_seconds=ttl,
            pinned=pinned,
        )
        assert state.id not in self.states
        self.states[state.id] = Model(
            principal,
            model,
            tier,
            fp,
            self.now,
            None if ttl is None else self.now + ttl,
            pinned,
            data,
        )
        return state.id

    @rule(seconds=st.sampled_from([0.5, 3, 10, 40]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(sid=ids, principal=PRINCIPALS, pinned=st.booleans())
    def pin(self, sid: str, principal: str, pinned: bool) -> None:
        self._mutation(principal)
        m = self.states.get(sid)
        if m is None or m.principal != principal:
            try:
                self.catalog.set_pinned(principal, sid, pinned)
            except NotFound:
                return
            raise AssertionError("pinned a state that is gone or another principal's")
        assert self.catalog.set_pinned(principal, sid, pinned).pinned is pinned
        m.pinned = pinned

    @rule(sid=ids, principal=PRINCIPALS)
    def load(self, sid: str, principal: str) -> None:
        m = self.states.get(sid)
        visible = m is not None and m.principal == principal and not m.expired(self.now)
        try:
            data = read_payload(self.catalog, principal, sid)
        except NotFound:
            assert not visible
        else:
            assert visible and m is not None and data == m.data
        self._mutation(principal)
        try:
            self.catalog.mark_loaded(principal, sid)
        except NotFound:
            assert not visible
        else:
            assert visible and m is not None
            m.last_accessed_at = self.now

    @rule(sid=ids, reason=st.sampled_from([None, SkipReason.LIVE_HANDOFF, SkipReason.ACTIVE]))
    def set_busy(self, sid: str, reason: SkipReason | None) -> None:
        if reason is None:
            self.busy.pop(sid, None)
        else:
            self.busy[sid] = reason

    def _prune(self, principal: str, request: PruneRequest) -> None:
        self._sync_expired()
        disk = self._on_disk(principal)
        if request.ids is not None:
            by_id = dict(disk)
            chosen = [(i, by_id[i]) for i in dict.fromkeys(request.ids) if i in by_id]
        elif request.filter is not None:
            f = request.filter
            chosen = [
                (sid, m)
                for sid, m in disk
                if (f.model is None or m.model == f.model)
                and (f.tier is None or m.tier == f.tier)
                and (
                    f.older_than_seconds is None or self.now - m.created_at >= f.older_than_seconds
                )
                and (f.expired is None or m.expired(self.now))
            ]
        else:
            chosen = disk
        skipped: list[PruneSkip] = []
        delete: list[str] = []
        for sid, m in chosen:
            reason = None
            if not m.expired(self.now):
                reason = SkipReason.PINNED if m.pinned else self.busy.get(sid)
            if reason is None:
                delete.append(sid)
            else:
                skipped.append(PruneSkip(id=sid, reason=reason))
        result = self.catalog.prune(principal, request, busy=self.busy.get)
        assert result.selected == [sid for sid, _ in chosen]
        assert result.skipped == skipped
        assert result.dry_run is request.dry_run
        if request.dry_run:
            assert result.deleted == []
            return
        assert result.deleted == delete
        self._mutation(principal)
        for sid in delete:
            self.states.pop(sid, None)

    @rule(principal=PRINCIPALS, ids=st.lists(ids, min_size=1, max_size=4), dry=st.booleans())
    def prune_ids(self, principal: str, ids: list[str], dry: bool) -> None:
        self._prune(principal, PruneRequest(ids=ids, dry_run=dry))

    @rule(
        principal=PRINCIPALS,
        model=st.none() | MODELS,
        tier=st.none() | TIERS,
        older=st.none() | st.sampled_from([0, 5, 60]),
        expired=st.sampled_from([None, True]),
        dry=st.booleans(),
    )
    def prune_filter(
        self,
        principal: str,
        model: str | None,
        tier: Tier | None,
        older: int | None,
        expired: bool | None,
        dry: bool,
    ) -> None:
        if model is None and tier is None and older is None and expired is None:
            return  # an empty filter is refused by the protocol type itself
        flt = PruneFilter(model=model, tier=tier, older_than_seconds=older, expired=expired)
        self._prune(principal, PruneRequest(filter=flt, dry_run=dry))

    @precondition(lambda self: len(self.states) > 2)
    @rule(principal=PRINCIPALS, dry=st.booleans())
    def prune_all(self, principal: str, dry: bool) -> None:
        self._prune(principal, PruneRequest(all=True, confirm="all", dry_run=dry))

    @rule()
    def reconcile(self) -> None:
        self._sync_expired()
        expected = sorted(
            (m.principal, sid) for sid, m in self.states.items() if m.expired(self.now)
        )
        report = self.catalog.reconcile()
        assert sorted(report.expired_deleted) == expected
        assert report.quarantined == report.unsafe_unlinked == report.staging_removed == 0
        for sid in [s for s, m in self.states.items() if m.expired(self.now)]:
            del self.states[sid]

    @rule(principal=PRINCIPALS, fp=st.integers(0, 2))
    def find(self, principal: str, fp: int) -> None:
        found = self.catalog.find(principal, fingerprint=fingerprint(fp))
        assert [s.id for s in found] == [sid for sid, m in self._live(principal) if m.fp == fp]

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def listing_matches_the_model(self) -> None:
        for principal in ("local", P_OTHER):
            listed = self.catalog.list(principal)
            live = self._live(principal)
            assert [s.id for s in listed] == [sid for sid, _ in live]
            for state, (sid, m) in zip(listed, live, strict=True):
                assert state.principal == principal and state.model == m.model
                assert state.tier == m.tier and state.pinned == m.pinned
                assert state.created_at == m.created_at and state.expires_at == m.expires_at
                assert state.last_accessed_at == m.last_accessed_at
                assert state.payload_sha256 == hashlib.sha256(m.data).hexdigest()
                assert self.catalog.get(principal, sid) == state


CatalogMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCatalogModel = CatalogMachine.TestCase
