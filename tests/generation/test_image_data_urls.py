"""Image data URLs as clients write them: base64 wrapped in lines (MIME, the `base64` tool),
without its padding, a media type in capitals; what is not base64 is still a 400."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from mlx_nursery.generation import ImageLimits, InvalidRequest
from mlx_nursery.generation._images import load_image


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (31, 17), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


WRAPPED = "data:image/png;base64," + base64.encodebytes(png()).decode()
UNPADDED = "data:image/png;base64," + base64.b64encode(png()).decode().rstrip("=")
CAPITALS = "data:IMAGE/PNG;BASE64," + base64.b64encode(png()).decode()
CRLF = "data:image/png;base64," + base64.encodebytes(png()).decode().replace("\n", "\r\n")


@pytest.mark.parametrize("url", [WRAPPED, UNPADDED, CAPITALS, CRLF])
def test_a_data_url_as_clients_write_it_decodes(url: str) -> None:
    assert "data:image/png;base64," + base64.b64encode(png()).decode() != UNPADDED  # padded
    image = load_image(url, ImageLimits(), "messages[0].content[0]", 1 << 24)
    assert image.size == (31, 17)


@pytest.mark.parametrize("payload", ["!!notbase64!!", "abc*def"])
def test_what_is_not_base64_is_refused(payload: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        load_image(f"data:image/png;base64,{payload}", ImageLimits(), "p", 1 << 24)
    assert refused.value.code == "invalid_image" and refused.value.param == "p"
