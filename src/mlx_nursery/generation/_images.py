"""Images in requests: where they may come from, what they may cost, how they are decoded.

An image part names its source by URL. `data:` URLs (PNG, JPEG, WebP, GIF: its first
frame) are always taken; `file://` URLs only under the directory the server was given
(`--allowed-local-media-path`, vLLM's name), resolved so that links and `..` cannot leave
it; http(s) URLs only of the hosts in `--allowed-media-domains`, fetched before the request
is prepared (`_media_fetch`).

Every limit is checked before the work it bounds: the encoded size before decoding the
base64, the pixel count from the image's header before decoding its pixels (a
decompression bomb is a few KB of PNG that decodes to gigabytes). Anything Pillow cannot
decode is the client's: a 400 naming the part, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import urllib.parse
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from PIL import Image

from ._errors import InvalidRequest, shortened
from ._media_hosts import MediaHost, fetch_failed, not_allowed, shown

log = logging.getLogger("mlx_nursery.openai")

FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF"})


@attrs.frozen
class ImageLimits:
    max_bytes: int = 20 << 20
    """Of one image's encoded file."""
    max_images: int = 16
    """Per request, all messages together."""
    max_pixels: int = 1 << 24
    """Of one decoded image (width x height): 4096 x 4096, a little above the most that
    common VLM processors keep (Qwen2-VL's 12.8 MP; larger images are scaled down to it)."""
    max_request_pixels: int = 1 << 25
    """Of a request's images together: two images at `max_pixels`, or sixteen of 2 MP. A
    decoded image is 3 bytes a pixel, and the processor's float copy of it 12 more."""
    local_path: Path | None = None
    """The directory `file://` URLs may name files under; None refuses them."""
    hosts: tuple[MediaHost, ...] = ()
    """Hosts (and ports) whose http(s) image URLs are fetched (`_media_fetch`); none by
    default."""
    allow_private: bool = False
    """Fetch from non-global addresses too (`_media_hosts`)."""
    fetch_timeout: float = 5.0
    """Seconds a fetch may take to connect, and between reads."""
    fetched: Mapping[str, bytes] = attrs.field(factory=dict)
    """This request's fetched images, by URL (set per request, before it is prepared)."""


def too_many_images(count: int, limits: ImageLimits, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"the request has {count} images; this server takes at most {limits.max_images}",
        param=param,
        code="image_too_large",
    )


def load_image(url: Any, limits: ImageLimits, param: str, pixels_left: int) -> Image.Image:
    """Decode the image at `url` (a data: or an allowed file: URL, or one fetched) as RGB,
    if it has at most `pixels_left` pixels (what the request's other images left of
    `max_request_pixels`). Raises InvalidRequest (400) naming `param` for anything it does
    not take. Blocking: call it on a worker thread."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest("an image part needs its URL", param=param, code="invalid_image")
    if url.startswith("data:"):
        data = _data_url_bytes(url, limits, param)
    elif url.startswith("file:"):
        data = _local_file_bytes(url, limits, param)
    elif url in limits.fetched:
        try:
            return _decode(limits.fetched[url], limits, param, pixels_left)
        except InvalidRequest as exc:  # as any failed fetch: the reason goes to the log
            log.info("fetched image refused: %s: %s", shown(url), exc.message)
            raise fetch_failed(param) from None
    elif url.startswith(("http://", "https://")):
        raise not_allowed(param)
    else:
        raise InvalidRequest(
            f"unsupported image URL {shortened(url, 40)!r}: use a data: URL",
            param=param,
            code="invalid_image",
        )
    return _decode(data, limits, param, pixels_left)


def _data_url_bytes(url: str, limits: ImageLimits, param: str) -> bytes:
    header, comma, payload = url.partition(",")
    header = header.lower()  # a data URL's media type and its ";base64" are case-insensitive
    if not comma or not header.endswith(";base64"):
        raise InvalidRequest(
            "an image data URL must be data:image/...;base64,...", param=param, code="invalid_image"
        )
    media = header[len("data:") : -len(";base64")].split(";")[0].strip().lower()
    if media and not media.startswith("image/"):
        raise InvalidRequest(
            f"a data URL of type {media!r} is not an image", param=param, code="invalid_image"
        )
    if len(payload) // 4 * 3 > limits.max_bytes + 2:
        raise too_large(len(payload) // 4 * 3, limits, param)
    # As base64 decoders take it: wrapped lines (MIME's 76 columns, `base64`'s output) and
    # the padding left off; anything else outside the alphabet is still refused.
    payload = "".join(payload.split())
    payload += "=" * (-len(payload) % 4)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            "the image data URL is not valid base64", param=param, code="invalid_image"
        ) from None


def _local_file_bytes(url: str, limits: ImageLimits, param: str) -> bytes:
    if limits.local_path is None:
        raise InvalidRequest(
            "file: image URLs are refused: the server was started without "
            "--allowed-local-media-path",
            param=param,
            code="invalid_image",
        )
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise InvalidRequest(
            "a file: URL must name a local file", param=param, code="invalid_image"
        )
    root = limits.local_path.resolve()
    path = Path(urllib.parse.unquote(parsed.path)).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise InvalidRequest(
            "the file is not one the server may read (outside --allowed-local-media-path, "
            "or missing)",
            param=param,
            code="invalid_image",
        )
    size = path.stat().st_size
    if size > limits.max_bytes:
        raise too_large(size, limits, param)
    return path.read_bytes()


def _decode(data: bytes, limits: ImageLimits, param: str, pixels_left: int) -> Image.Image:
    if len(data) > limits.max_bytes:
        raise too_large(len(data), limits, param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=sorted(FORMATS))
            width, height = image.size  # from the header: nothing decoded yet
            if width * height > limits.max_pixels:
                raise InvalidRequest(
                    f"the image has {width}x{height} pixels; this server takes at most "
                    f"{limits.max_pixels} per image (--max-image-pixels)",
                    param=param,
                    code="image_too_large",
                )
            if width * height > pixels_left:
                raise InvalidRequest(
                    f"the image has {width}x{height} pixels, more than the "
                    f"{max(pixels_left, 0)} the request's other images left of this server's "
                    f"{limits.max_request_pixels} per request "
                    "(--max-image-pixels-per-request)",
                    param=param,
                    code="image_too_large",
                )
            image.seek(0)  # an animation's first frame
            return image.convert("RGB")
    except InvalidRequest:
        raise
    except (
        OSError,
        SyntaxError,
        ValueError,
        EOFError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ):
        raise InvalidRequest(
            "the image could not be decoded (PNG, JPEG, WebP and GIF are taken)",
            param=param,
            code="invalid_image",
        ) from None


def too_large(size: int, limits: ImageLimits, param: str) -> InvalidRequest:
    """The 400 for an image of `size` bytes or more (a file's size, a data URL's decoded
    size, or as much of a fetched image as was read) past the byte limit."""
    return InvalidRequest(
        f"the image is {size} bytes or more; this server takes at most {limits.max_bytes} "
        "per image",
        param=param,
        code="image_too_large",
    )
