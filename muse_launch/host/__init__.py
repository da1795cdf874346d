"""What this host offers: its GPUs (NVML, AMD SMI) and the engines and routers installed."""
