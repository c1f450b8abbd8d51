"""SGLang (sgl-project/sglang): flags, start-up phases, readiness (FACTS.md §2)."""

from __future__ import annotations

from tuitune.engines.base import Engine


class SGLang(Engine):
    name = "sglang"
    label = "SGLang"
    default_module = "sglang.launch_server"
    default_port = 30000
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
        "speculative-ngram-min-bfs-breadth": "speculative.ngram_min_bfs_breadth",
        "speculative-ngram-max-bfs-breadth": "speculative.ngram_max_bfs_breadth",
        "speculative-ngram-max-trie-depth": "speculative.ngram_max_trie_depth",
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
        if preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            out += ["--speculative-algorithm", "NGRAM"] + self._ngram_flags(preset.speculative)
        elif preset.is_speculative:
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

    @staticmethod
    def _ngram_flags(s) -> list[str]:
        """SGLang's NGRAM: the draft token budget and the tree's bounds, each only when set (SGLang
        fills in 12 tokens and breadth 1-10 itself and logs that it did)."""
        out: list[str] = []
        for key, flag in (
            ("num_draft_tokens", "--speculative-num-draft-tokens"),
            ("ngram_min_bfs_breadth", "--speculative-ngram-min-bfs-breadth"),
            ("ngram_max_bfs_breadth", "--speculative-ngram-max-bfs-breadth"),
            ("ngram_max_trie_depth", "--speculative-ngram-max-trie-depth"),
        ):
            if getattr(s, key) is not None:
                out += [flag, str(getattr(s, key))]
        return out

    def help_args(self, preset) -> list[str]:
        return ["--help"]

    def validate(self, preset) -> None:
        s = preset.speculative
        if s is None:
            return
        if s.algorithm == "SUFFIX":
            raise ValueError(
                "speculative.algorithm: SUFFIX is vLLM's suffix decoding (server.engine: vllm); SGLang's "
                "model-free drafter is NGRAM"
            )
        ngram = s.algorithm == "NGRAM"
        for key, sglang_key in (
            ("num_speculative_tokens", "num_draft_tokens (drafts + 1)" if ngram else "num_steps"),
            ("draft_tensor_parallel_size", None),
            ("prompt_lookup_min", None),
            ("prompt_lookup_max", None),
        ):
            if getattr(s, key) is not None:
                instead = f"; SGLang spells it speculative.{sglang_key}" if sglang_key else ""
                raise ValueError(f"speculative: {key} is a vLLM setting (server.engine: vllm){instead}")

    def lint(self, preset) -> list[str]:
        if preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            if preset.speculative.num_draft_tokens is None:
                return [
                    "speculative: num_draft_tokens unset, SGLang's NGRAM verifies 12 tokens a cycle at "
                    "breadth up to 10; set num_draft_tokens (and ngram_max_bfs_breadth) to make runs comparable"
                ]
            return []
        if preset.is_speculative and preset.speculative.num_steps is None:
            return [
                "speculative: num_steps unset, SGLang picks steps/topk/draft tokens per model; "
                "set them to make runs comparable"
            ]
        return []

    def static_config(self, preset) -> tuple[int, int, int] | None:
        r = preset.speculative.resolved()
        return None if r.num_steps is None else (r.num_steps, r.eagle_topk, r.num_draft_tokens)

    def search_topks(self, preset) -> tuple[int, ...]:
        # NGRAM's trees are looked up, not drafted: the rank model of EAGLE trees says nothing of
        # them, so its search walks chains (breadth 1) of every length, its start included
        if preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            return (1,)
        return self.topks

    def config_changes(self, c, preset=None) -> dict:
        if preset is not None and preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            if c.steps != c.draft_tokens - 1:
                raise ValueError(
                    f"{c.label}: SGLang's NGRAM tree is num_draft_tokens deep at most; its configurations are "
                    "draft tokens and breadth, not steps"
                )
            return {"num_draft_tokens": c.draft_tokens, "ngram_max_bfs_breadth": c.topk, "ngram_min_bfs_breadth": None}
        # a static configuration: any adaptive schedule is dropped
        return {"num_steps": c.steps, "eagle_topk": c.topk, "num_draft_tokens": c.draft_tokens, "adaptive_config": None}

    def speculative_view(self, preset) -> dict:
        r = preset.speculative.resolved()
        if r.algorithm == "NGRAM":
            s = preset.speculative
            return {
                "speculative.algorithm": "NGRAM",
                "speculative.num_draft_tokens": r.num_draft_tokens,
                "speculative.ngram_max_bfs_breadth": r.eagle_topk,
                "speculative.ngram_min_bfs_breadth": s.ngram_min_bfs_breadth or 1,
                **({"speculative.ngram_max_trie_depth": s.ngram_max_trie_depth} if s.ngram_max_trie_depth else {}),
            }
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
