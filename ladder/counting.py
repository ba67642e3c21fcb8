"""The one counter of parameters and FLOPs; every artifact names the conventions below.

Parameter conventions
---------------------
``exact-v1``
    The parameters the model actually has (``model/``): equals the size of the parameter pytree.
    *active* = everything a token touches except the token embedding and the LM head: attention,
    norms, router (+ its bias), latent projections, the shared experts and top-k of the routed
    experts. *total* = every parameter.
``marin-sizing-v1``
    How the real ladder sized its rungs: like ``exact-v1`` but every layer's K/V projections at
    the *local* KV-head count (heads/4; global layers have heads/8), weight matrices only (norm
    scales and router bias, ~0.03%, left out). It reproduces the published sizes (60.56M ...
    22.76B active; Marin's public hero-run tracking issue) to 1e-4 and every published step
    count; ``exact-v1`` is up to 0.65% lower for the real rungs.

Both conventions count the recipe's GatedNorm matrices, short-convolution kernels and attention
head gates in *total*, outside *active* (the published active sizes are reproduced without
them), exactly (per-layer KV heads); zero with the switches off (every ladder but marin-535b).

FLOP convention ``flops-v1``
----------------------------
Forward FLOPs per token = 2 x (active matrix parameters: attention, router, latent projections,
shared and top-k routed experts; norms and biases excluded) + attention scores and values,
4 x n_heads x head_dim x context per layer, with context = seq_len for global layers and
min(local_window, seq_len) for local ones (the full window, no causal halving, as the real ladder
counted). The LM head adds 2 x d x vocab. Training FLOPs = 3 x forward x tokens (backward = 2 x
forward). The real ladder's fit uses compute *without* the LM head; both are reported.

The forward also holds ``extras`` (issue 12), the recipe's pieces when switched on: GatedNorm
2 x 2 x d x r per norm, the head gate 2 x d x n_heads, each short convolution 2 x kernel x
channels, XSA 6 x n_heads x head_dim (two dot products and the subtraction) per layer and token;
zero with the switches off. The published FLOP figures leave them out: marin-535b's compute is
``extras_fraction`` above them (0.7% for the hero, 1.8-3.8% for the rungs), and the published
figures are ``compute - compute_extras`` (``ladder list --json``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ladder.model.config import ModelConfig

PARAM_CONVENTION = "exact-v1"
SIZING_CONVENTIONS = ("exact-v1", "marin-sizing-v1")
FLOP_CONVENTION = "flops-v1"


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts by group. ``routed_experts`` holds all E experts of all layers."""

    embedding: int
    lm_head: int
    attention: int        # q, k, v, o projections and the QK-norm scales
    norms: int            # the two pre-norms of each layer, the final norm (and embedding norm)
    router: int           # router weight (+ router bias, which is not gradient-trained)
    latent: int           # down/up projections of the routed path and the latent norm
    shared_experts: int
    routed_experts: int
    routed_active: int    # top_k / n_experts of routed_experts
    gated_norms: int = 0  # GatedNorm W_down and W_up of every residual-stream norm
    convs: int = 0        # short-convolution kernels (K, attention output, MoE output)
    head_gates: int = 0   # attention head-gate weights [D, H] per layer
    convention: str = PARAM_CONVENTION

    @property
    def extras(self) -> int:
        """The recipe's pieces outside active parameters: GatedNorm, convolutions, head gates."""
        return self.gated_norms + self.convs + self.head_gates

    @property
    def total(self) -> int:
        return (self.embedding + self.lm_head + self.attention + self.norms
                + self.router + self.latent + self.shared_experts + self.routed_experts
                + self.extras)

    @property
    def active(self) -> int:
        """Parameters a token uses, embedding, LM head and the recipe's extras left out."""
        return (self.attention + self.norms + self.router + self.latent
                + self.shared_experts + self.routed_active)

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "active": self.active,
                "extras": self.extras}


def _swiglu(d_in: int, hidden: int) -> int:
    return 3 * d_in * hidden  # gate, up (d_in x hidden) and down (hidden x d_in)


def _attention_matrices(cfg: ModelConfig, kv_heads: int) -> int:
    return 2 * cfg.d_model * (cfg.q_dim + kv_heads * cfg.head_dim)  # q and o; k and v


def count_params(cfg: ModelConfig, convention: str = PARAM_CONVENTION) -> ParamCount:
    if convention not in SIZING_CONVENTIONS:
        raise ValueError(f"convention: must be one of {SIZING_CONVENTIONS}, got {convention!r}")
    d, L = cfg.d_model, cfg.n_layers
    sizing = convention == "marin-sizing-v1"
    vec = 0 if sizing else 1  # norm scales and biases: counted by exact-v1 only
    attention = 0
    qk_gains = 2 * cfg.head_dim if cfg.qk_norm == "learned" else 0   # "rms": no gains
    for layer in range(L):
        kv = cfg.n_kv_heads_local if sizing else cfg.n_kv_heads(layer)
        attention += _attention_matrices(cfg, kv) + vec * qk_gains
    per_expert = _swiglu(cfg.latent_dim, cfg.expert_dim)
    return ParamCount(
        embedding=cfg.vocab_size * d,
        lm_head=d * cfg.vocab_size,
        attention=attention,
        norms=vec * (L * 2 * d + d + d * cfg.embed_norm),   # + the final norm
        router=L * (d * cfg.n_experts + vec * cfg.n_experts),
        latent=L * (2 * d * cfg.latent_dim + vec * cfg.latent_dim),
        shared_experts=L * cfg.n_shared * _swiglu(d, cfg.shared_dim),
        routed_experts=L * cfg.n_experts * per_expert,
        routed_active=L * cfg.top_k * per_expert,
        gated_norms=_residual_norms(cfg) * 2 * d * cfg.gated_rank,
        convs=sum(cfg.conv_kernel * _conv_channels(cfg, layer) for layer in range(L)),
        head_gates=L * d * cfg.n_heads * cfg.head_gate,
        convention=convention,
    )


def _residual_norms(cfg: ModelConfig) -> int:
    """RMSNorms on the residual stream (each followed by a GatedNorm when it is on): two per
    layer, the final norm, and the embedding norm when there is one."""
    return 2 * cfg.n_layers + 1 + cfg.embed_norm


def _conv_channels(cfg: ModelConfig, layer: int) -> int:
    """Channels the short convolutions of ``layer`` filter: K (kv heads x head_dim), the
    attention output and the MoE output (d each); 0 when they are off."""
    if not cfg.conv_kernel:
        return 0
    return cfg.n_kv_heads(layer) * cfg.head_dim + 2 * cfg.d_model


@dataclass(frozen=True)
class FlopCount:
    """FLOPs per token of one forward pass, by part, at a given sequence length."""

    matmul: int       # 2 x active matrix parameters
    attention: int    # scores and values
    lm_head: int
    seq_len: int
    extras: int = 0   # GatedNorm, short convolutions, XSA, head gates (module docstring)
    convention: str = FLOP_CONVENTION

    @property
    def forward_no_lm_head(self) -> int:
        return self.matmul + self.attention + self.extras

    @property
    def extras_fraction(self) -> float:
        """extras / forward without the LM head: how far above the published figures."""
        return self.extras / self.forward_no_lm_head

    @property
    def forward(self) -> int:
        return self.forward_no_lm_head + self.lm_head

    def training(self, tokens: float, *, lm_head: bool = True) -> float:
        """Training FLOPs for ``tokens`` tokens: 3 x forward (forward + 2 x backward)."""
        return 3.0 * (self.forward if lm_head else self.forward_no_lm_head) * float(tokens)

    def to_dict(self) -> dict:
        return {**asdict(self), "forward": self.forward,
                "forward_no_lm_head": self.forward_no_lm_head,
                "extras_fraction": self.extras_fraction}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> FlopCount:
    d = cfg.d_model
    matrices = 0
    attention = 0
    for layer in range(cfg.n_layers):
        matrices += _attention_matrices(cfg, cfg.n_kv_heads(layer))
        context = seq_len if cfg.is_global(layer) else min(cfg.local_window, seq_len)
        attention += 4 * cfg.q_dim * context  # QK^T and AV, 2 FLOPs per multiply-add each
    matrices += cfg.n_layers * (d * cfg.n_experts + 2 * d * cfg.latent_dim
                                + cfg.n_shared * _swiglu(d, cfg.shared_dim)
                                + cfg.top_k * _swiglu(cfg.latent_dim, cfg.expert_dim))
    extras = (2 * 2 * d * cfg.gated_rank * _residual_norms(cfg)
              + cfg.n_layers * (2 * d * cfg.n_heads * cfg.head_gate + 6 * cfg.q_dim * cfg.xsa)
              + sum(2 * cfg.conv_kernel * _conv_channels(cfg, layer)
                    for layer in range(cfg.n_layers)))
    return FlopCount(matmul=2 * matrices, attention=attention, lm_head=2 * d * cfg.vocab_size,
                     seq_len=seq_len, extras=extras)


def conventions() -> dict:
    """The block every artifact carries under ``"conventions"``."""
    return {"params": PARAM_CONVENTION, "flops": FLOP_CONVENTION,
            "compute": "training FLOPs = 3 x forward FLOPs x tokens; 'compute' excludes the LM "
                       "head, 'compute_with_lm_head' includes it"}
