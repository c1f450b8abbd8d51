"""SGLang (sgl-project/sglang): flags, start-up phases, readiness (FACTS.md §2)."""

from __future__ import annotations

from tuitune.engines.base import Engine


class SGLang(Engine):
    name = "sglang"
    label = "SGLang"
    default_module = "sglang.launch_server"
    default_port = 30000
    model_arg = "model-path"
    reserved_args = {
        "port": "server.port",
        "speculative-algorithm": "speculative.algorithm",
        "speculative-draft-model-path": "speculative.draft_model_path",
        "speculative-draft-model": "speculative.draft_model_path",
        "speculative-num-steps": "speculative.num_steps",
        "speculative-eagle-topk": "speculative.eagle_topk",
        "speculative-num-draft-tokens": "speculative.num_draft_tokens",
        "speculative-adaptive": "speculative.adaptive_config",
        "speculative-adaptive-config": "speculative.adaptive_config",
        # multi-node: rendered per node from target.nodes (Preset.node_presets)
        "nnodes": "target.nodes",
        "node-rank": "target.nodes",
        "dist-init-addr": "target.nodes and server.dist_init_port",
    }
    phases = (
        ("Load weight begin", "loading weights"),
        ("Capture cuda graph begin", "capturing graphs"),
        ("Capture draft cuda graph begin", "capturing draft graphs"),
    )

    def launch_args(self, preset) -> list[str]:
        out = self.plain_flags(preset.server.args) + ["--port", str(preset.server.port)]
        if preset.is_speculative:
            r = preset.speculative.resolved()
            out += ["--speculative-algorithm", r.algorithm]
            if preset.speculative.draft_model_path:
                out += ["--speculative-draft-model-path", preset.speculative.draft_model_path]
            if r.num_steps is not None:
                out += [
                    "--speculative-num-steps",
                    str(r.num_steps),
                    "--speculative-eagle-topk",
                    str(r.eagle_topk),
                    "--speculative-num-draft-tokens",
                    str(r.num_draft_tokens),
                ]
            if preset.speculative.adaptive_config:
                out += ["--speculative-adaptive", "--speculative-adaptive-config", preset.speculative.adaptive_config]
        return out

    def help_args(self, preset) -> list[str]:
        return ["--help"]

    def validate(self, preset) -> None:
        s = preset.speculative
        if s is None:
            return
        for key, sglang_key in (("num_speculative_tokens", "num_steps"), ("draft_tensor_parallel_size", None)):
            if getattr(s, key) is not None:
                instead = f"; SGLang spells it speculative.{sglang_key}" if sglang_key else ""
                raise ValueError(f"speculative: {key} is a vLLM setting (server.engine: vllm){instead}")

    def lint(self, preset) -> list[str]:
        if preset.is_speculative and preset.speculative.num_steps is None:
            return [
                "speculative: num_steps unset, SGLang picks steps/topk/draft tokens per model; "
                "set them to make runs comparable"
            ]
        return []

    def static_config(self, preset) -> tuple[int, int, int] | None:
        r = preset.speculative.resolved()
        return None if r.num_steps is None else (r.num_steps, r.eagle_topk, r.num_draft_tokens)

    def config_changes(self, c) -> dict:
        # a static configuration: any adaptive schedule is dropped
        return {"num_steps": c.steps, "eagle_topk": c.topk, "num_draft_tokens": c.draft_tokens, "adaptive_config": None}

    def speculative_view(self, preset) -> dict:
        r = preset.speculative.resolved()
        return {
            "speculative.algorithm": r.algorithm,
            "speculative.draft_model_path": preset.speculative.draft_model_path,
            "speculative.num_steps": r.num_steps,
            "speculative.eagle_topk": r.eagle_topk,
            "speculative.num_draft_tokens": r.num_draft_tokens,
            **(
                {"speculative.adaptive_config": preset.speculative.adaptive_config}
                if preset.speculative.adaptive_config
                else {}
            ),
        }
