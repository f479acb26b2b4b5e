"""engine/dma/: DMA and semaphore state machines, what a DMA signals, DMAs across devices and
cores."""
