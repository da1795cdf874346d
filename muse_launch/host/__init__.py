"""What this host offers: its GPUs (NVML, AMD SMI), the engines and routers installed, where a program is found."""
