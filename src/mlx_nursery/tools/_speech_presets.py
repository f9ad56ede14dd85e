"""The text-to-speech presets (`tiny-tts`, a KittenTTS; `tiny-kokoro`, a Kokoro), written by
`_tts_factory.py`; `_presets.py` lists them with the others."""

from __future__ import annotations

from ._preset import Preset

_TINY_ALBERT = {
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
}
"""The text-to-speech presets' ALBERT (its 512 positions: the symbols of one forward)."""


SPEECH_PRESETS: dict[str, Preset] = {
    "tiny-tts": Preset(
        "tiny-tts",
        {
            # mlx-audio's KittenTTS config (`kitten_tts.ModelConfig`). The style vector is
            # 256 wide whatever the config says (the model slices it at 128): style_dim 128.
            "model_type": "kitten_tts",
            "hidden_dim": 32,
            "max_conv_dim": 32,
            "max_dur": 4,  # frames per symbol at most: short clips, quick tests
            "n_layer": 1,
            "n_mels": 80,
            "n_token": 178,
            "style_dim": 128,
            "text_encoder_kernel_size": 5,
            "asr_res_dim": 16,
            "decoder_out_dim": 32,
            "sample_rate": 24000,
            "plbert": _TINY_ALBERT | {"embedding_size": 16},
            "istftnet": {
                "resblock_kernel_sizes": [3],
                "upsample_rates": [4, 4],
                "upsample_initial_channel": 32,
                "resblock_dilation_sizes": [[1, 3, 5]],
                "upsample_kernel_sizes": [8, 8],
                "gen_istft_n_fft": 20,
                "gen_istft_hop_size": 5,
            },
        },
        trained_vocab=0,
        synthesis=True,
    ),
    "tiny-kokoro": Preset(
        "tiny-kokoro",
        {
            # mlx-audio's Kokoro config (`kokoro.ModelConfig`; `vocab` is the factory's).
            # Its decoder's widths are fixed (1024 channels; hidden_dim 512 feeds it): 56M
            # parameters at least, so the tests keep its sentences few and short.
            "model_type": "kokoro",
            "dim_in": 64,
            "dropout": 0.2,
            "hidden_dim": 512,
            "max_conv_dim": 512,
            "max_dur": 2,  # frames per symbol at most: a speed below 1 still lengthens
            "multispeaker": True,
            "n_layer": 1,
            "n_mels": 80,
            "n_token": 178,
            "style_dim": 128,  # the model slices its 256-wide voice vectors at 128
            "text_encoder_kernel_size": 5,
            "sample_rate": 24000,
            "plbert": _TINY_ALBERT,
            "istftnet": {
                "resblock_kernel_sizes": [3],
                "upsample_rates": [2, 2],  # few samples per frame: the vocoder's cost
                "upsample_initial_channel": 512,
                "resblock_dilation_sizes": [[1, 3, 5]],
                "upsample_kernel_sizes": [4, 4],
                "gen_istft_n_fft": 20,
                "gen_istft_hop_size": 5,
            },
        },
        trained_vocab=0,
        synthesis=True,
    ),
}
