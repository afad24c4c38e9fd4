"""One search session's small values in Ray's key-value store: its ``internal_kv``, the
module Ray's own libraries use for small shared values, kept by the cluster's head, which
every node reaches. ASHA's decisions at rungs (``rung_decisions``) and rank 0's kept
reports (``distributed.RankZeroLastReports``) live here, and Ray's store is reached only
through this module.

Each key carries its session, unique to one search session, so that an earlier session's
values on a long-lived cluster never answer this one's, and ``clear`` drops the session's
values at its end (a cluster outlives its searches).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SessionStore:
    namespace: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex)

    @staticmethod
    def available() -> bool:
        """Whether this process is connected to a Ray whose store it can reach."""
        from ray.experimental.internal_kv import _internal_kv_initialized

        return _internal_kv_initialized()

    def put(self, name: str, value: bytes) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(self._key(name), value, namespace=self.namespace)

    def get(self, name: str) -> bytes | None:
        from ray.experimental.internal_kv import _internal_kv_get

        return _internal_kv_get(self._key(name), namespace=self.namespace)

    def delete(self, name: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(self._key(name), namespace=self.namespace)

    def clear(self) -> None:
        """Drop this session's values (nothing to do without a Ray)."""
        from ray.experimental.internal_kv import _internal_kv_del

        if self.available():
            _internal_kv_del(f"{self.session}/".encode(), del_by_prefix=True, namespace=self.namespace)

    def _key(self, name: str) -> bytes:
        return f"{self.session}/{name}".encode()
