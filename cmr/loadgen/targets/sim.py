"""The simulated store (:class:`cmr.loadgen.sim.SimStore`) as a target, in this process."""

from __future__ import annotations

from cmr.loadgen.sim import ConditionalCheckFailed, SimConfig, SimStore
from cmr.loadgen.targets.base import Reply, _failed


class SimTarget:
    """The simulated store in this process; its over-capacity refusal counts as unavailable."""

    name = "sim"
    consistent_reads = True
    conditional_writes = True

    def __init__(self, config: SimConfig | None = None, store: SimStore[int] | None = None) -> None:
        # a given store lets several targets be clients of one simulated store
        self.store: SimStore[int] = store if store is not None else SimStore(config)
        self.time_scale = self.store.config.time_scale
        self._versions: dict[str, int] = {}

    async def setup(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def get(self, key: str, consistent: bool = False) -> Reply:
        try:
            value, version = await self.store.get(key, consistent)
        except Exception as exc:
            raise _failed(exc, "sim") from exc
        self._versions[key] = version
        return Reply(value)

    async def put(self, key: str, value: int, conditional: bool = False) -> Reply:
        try:
            version = await self.store.put(
                key, value, self._versions.get(key, 0) if conditional else None
            )
        except ConditionalCheckFailed as exc:
            self._versions[key] = exc.current
            raise _failed(exc, "sim") from exc
        except Exception as exc:
            raise _failed(exc, "sim") from exc
        self._versions[key] = version
        return Reply()
