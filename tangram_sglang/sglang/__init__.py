"""Everything that names an SGLang 0.5.23 symbol: the plugin entry point and its hooks
(plugin.py), the server arguments (server_args.py), what composes and what is refused
(compatibility.py), the attention backend, the radix tree, the memory pool and scheduling
adapters, and a process helper that launches SGLang servers (server_process.py)."""
