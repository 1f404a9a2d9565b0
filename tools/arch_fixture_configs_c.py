"""The Hugging Face configs of tools/gen_arch_fixtures.py's tiny random models, part three (part one,
tools/arch_fixture_configs.py, merges these into its ARCHS; split to keep each file under 600 lines):
name -> (config class, model class, config keywords)."""

ARCHS_C = {
    # BitNet b1.58 2B-4T style (bitnet; BitNetForCausalLM): attention and MLP each with an RMSNorm inside the branch
    # (attn_sub_norm before o_proj, ffn_sub_norm before down_proj), a squared-ReLU gate (relu2: the release's
    # hidden_act; the converter patched to write bitnet.hidden_activation), GQA 2:1, NEOX rope at the release's
    # theta 5e5, tied head (llama.cpp's bitnet loads no output tensor). The converter writes each projection as
    # its ternary form times mean |W| (tools/bitnet_fixture.py, whose steps gen_arch_fixtures runs)
    "bitnet": ("BitNetConfig", "BitNetForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        hidden_act="relu2", rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # 1bitLLM/bitnet_b1_58 style (bitnet; the release's BitnetForCausalLM class name and sub-norm names): the same
    # graph with SiLU gating (the release's hidden_act), MHA, theta 10000; no activation key in the file (llama.cpp's
    # default: silu)
    "bitnet-silu": ("BitNetConfig", "BitNetForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=True,
        attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}
