"""The pure planner: ``plan(body, Observed, now) -> Plan``. What a pass decides, never how it is carried out: no
asyncio, kopf, aiohttp or process settings here (they come in as data), so every decision has a table test."""
