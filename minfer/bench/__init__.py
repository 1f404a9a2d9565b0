"""Benchmarking: synthetic models at real geometries (synth, presets), llama-bench-style
measurement with A/B of switches (bench), the torch-bf16 yardstick (peers, peer_dequant),
the machine record (machine) and plots of recorded runs (plot)."""
