"""OutputLead: a run waits while its unread audio reaches the bound, and goes on as readers take chunks."""

from __future__ import annotations

import asyncio

import pytest

from chorus.gateway.output_lead import OutputLead


async def test_the_run_waits_at_the_bound_until_a_reader_takes_a_chunk():
    lead = OutputLead(max_lead_s=1.0)
    for sequence, end_s in enumerate((0.4, 0.8, 1.2)):
        await asyncio.wait_for(lead.wait_for_room(), timeout=1.0)
        lead.journaled(sequence, end_s)
    assert lead.lead_s == pytest.approx(1.2)
    waiting = asyncio.create_task(lead.wait_for_room())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    lead.read(0)  # 0.8 s unread now: room again
    await asyncio.wait_for(waiting, timeout=1.0)
    assert lead.lead_s == pytest.approx(0.8)


async def test_reading_a_later_chunk_takes_the_earlier_ones_and_unjournaled_ones_are_ignored():
    lead = OutputLead(max_lead_s=2.0)
    for sequence in range(5):
        lead.journaled(sequence, 0.5 * (sequence + 1))
    lead.read(3)
    assert lead.lead_s == pytest.approx(0.5)
    lead.read(9)  # the end of the stream (flush chunk) was never counted
    assert lead.lead_s == 0.0
    lead.journaled(5, 3.0)
    assert lead.lead_s == pytest.approx(0.5)


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="max_lead_s"):
        OutputLead(max_lead_s=0)
