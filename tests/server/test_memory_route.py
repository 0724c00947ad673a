"""``GET /werk/v1/memory`` on this machine: real host numbers, truthful accelerator status."""

from __future__ import annotations

import msgspec
import psutil
from _server import WerkServer

from werk.memory.cgroup import read_cgroup_budget
from werk.protocol import CapabilitiesResponse, MemoryResponse

TOLERANCE = 256 * 2**20  # memory moves between the server's sample and ours


def test_memory_reports_real_host_numbers(local_server: WerkServer) -> None:
    with local_server.client() as http:
        before = psutil.virtual_memory()
        response = http.get("/werk/v1/memory")
        after = psutil.virtual_memory()
        caps = msgspec.json.decode(
            http.get("/werk/v1/capabilities").content, type=CapabilitiesResponse
        )
    assert response.status_code == 200, response.text
    memory = msgspec.json.decode(response.content, type=MemoryResponse)
    assert memory.host is not None
    budget = read_cgroup_budget()
    # The documented formula (docs/memory.md): a cgroup limit lower than RAM is the budget.
    total = before.total if budget is None else min(before.total, budget.limit_bytes)
    cap = total if budget is None else min(total, budget.headroom_bytes)
    assert memory.host.total_bytes == total
    assert memory.host.used_bytes + memory.host.available_bytes == memory.host.total_bytes
    low = min(min(before.available, after.available), cap) - TOLERANCE
    high = min(max(before.available, after.available), cap) + TOLERANCE
    assert low <= memory.host.available_bytes <= high
    rows = {row.id: row for row in caps.capabilities}
    accelerator = rows["runtime.memory.telemetry.accelerator"]
    if memory.accelerators:
        assert accelerator.status == "supported"
    else:
        # This machine has no NVIDIA driver: "could not sample" (null) or "none present" ([]),
        # never fabricated zeros, and the capability says unavailable with a reason.
        assert accelerator.status == "unavailable" and accelerator.reason
    assert rows["runtime.memory.telemetry.host"].status == "supported"
    assert memory.pressure in ("normal", "soft", "hard", "emergency")
    assert memory.managed.allocated_bytes == 0 and memory.managed.reserved_bytes == 0
