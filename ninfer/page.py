"""The page size: tokens per Device KV page, which is also one prefix-cache block (the index's
tree node, one Host slab's worth of KV). Below every other module; every 64 that means it reads
`PAGE_SIZE`."""

PAGE_SIZE = 64
