"""The choices `tica leg run` offers, apart from the runner so its parser costs no import of it."""

ITEMS = ("forward", "backward", "update", "quality", "throughput", "clean_exit")
ROLES = ("client", "trainer")
TRAINERS = ("vllm_kernels", "vllm_engine", "transformers", "megatron", "external")
