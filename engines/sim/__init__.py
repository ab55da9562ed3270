"""Engine simulators: fake vLLM and SGLang servers with their wire quirks, costs, metrics and faults.

Run one with `python -m engines.sim --engine vllm|sglang --port N`; start them from Python with
`engines.sim.launcher.SimProcess`. See docs/simulators.md.
"""
