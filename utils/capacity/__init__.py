"""Capacity and cost: where to operate an engine, what GPU work costs, and accelerators beyond the GPU.

- ``operating_point``: lab 04's capacity-planning conventions: where to operate an engine, and how to pick one.
- ``cost``: what GPU work costs: per sample, per 1M tokens, on spot vs on-demand, right-sized, shared.
- ``accelerators``: inference accelerators beyond the course's GPUs, their prices, and the cheapest one for a TPOT
  SLO.
"""
