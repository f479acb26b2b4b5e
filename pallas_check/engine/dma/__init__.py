"""DMAs and semaphores as small state machines (engine.py) and the devices and cores a
remote DMA or signal targets (devices.py). The rules that drive them are engine/rules/."""
