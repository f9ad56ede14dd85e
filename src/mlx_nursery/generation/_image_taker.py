"""A request's images, taken in order as its messages are rendered: each decoded within the
request's limits (count, bytes, pixels), then all given to the model's vision processor
with the rendered prompt."""

from __future__ import annotations

from typing import Any

import attrs

from ..engine import ImageInputs, VisionProcessor
from ._checkpoint import checkpoint
from ._errors import InvalidRequest, shortened
from ._images import ImageLimits, load_image, too_many_images
from ._served import ServedModel


def image_taker(served: ServedModel) -> ImageTaker:
    """A request's `ImageTaker` for the served model (its vision processor and limits)."""
    return ImageTaker(served.vision, served.image_limits, "url")


@attrs.define
class ImageTaker:
    """Decodes a request's image parts in order, within its limits (one per request)."""

    vision: VisionProcessor | None
    limits: ImageLimits
    url_param: str
    """Where a part keeps its URL, as errors name it (chat's `image_url.url`)."""
    images: list[Any] = attrs.Factory(list)
    params: list[str] = attrs.Factory(list)
    """Each image's part, as errors name it."""
    pixels: int = 0
    """The images' pixels so far (`ImageLimits.max_request_pixels` bounds them)."""

    def take(self, part: Any, param: str) -> dict[str, str]:
        """An image part (`part.image_url`: a URL, or chat's `{"url"}`) of part `param`."""
        source = part.image_url
        url = source.get("url") if isinstance(source, dict) else source
        return self.take_url(url, param, f"{param}.{self.url_param}")

    def take_url(self, url: Any, param: str, url_param: str) -> dict[str, str]:
        """The image at `url` (errors name the part `param`, its URL `url_param`); its
        placeholder part for the template."""
        if self.vision is None:
            raise InvalidRequest(
                "this model does not take images (text only)",
                param=f"{param}.type",
                code="unsupported_content",
            )
        if len(self.images) >= self.limits.max_images:
            raise too_many_images(len(self.images) + 1, self.limits, param)
        checkpoint()  # each decoding is a costly step
        pixels_left = self.limits.max_request_pixels - self.pixels
        image = load_image(url, self.limits, url_param, pixels_left)
        self.pixels += image.width * image.height
        self.images.append(image)
        self.params.append(param)
        return {"type": "image"}

    def prepare(self, text: str) -> tuple[list[int], ImageInputs]:
        """The rendered text and the images taken, through the model's processor."""
        assert self.vision is not None  # images are taken only with one
        try:
            return self.vision.prepare(text, self.images)
        except (ValueError, TypeError, IndexError) as exc:  # the processor's own rules
            raise self._refused(self.vision, exc) from None

    def _refused(self, vision: VisionProcessor, exc: Exception) -> InvalidRequest:
        """The 400 for images the model's processor would not take, naming the first image
        it refuses alone (the error path only: each image is processed again)."""
        culprit = None
        for image, param in zip(self.images, self.params, strict=True):
            try:
                vision.check_image(image)
            except (ValueError, TypeError, IndexError):
                culprit = param
                break
        return InvalidRequest(
            f"the model's image processor refused the image: {shortened(str(exc), 200)}",
            param=culprit,
            code="invalid_image",
        )
