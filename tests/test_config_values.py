"""Override values as YAML reads them: a mapping written without a space after its colon
(`env.kwargs={size:7}`) is refused with the fix, not passed on as a key `size:7`."""

import pytest

from lucid.config import ConfigError, make_config


def test_a_glued_colon_in_a_mapping_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"'size:7' with no value: YAML needs a space after "
                                          r"the colon, e\.g\. \{size: 7\}"):
        make_config(overrides=["env.kwargs={size:7}"])
    with pytest.raises(ConfigError, match="'b:2'"):  # inside a nested mapping too
        make_config(overrides=["env.kwargs={a: {b:2}}"])
    assert make_config(overrides=["env.kwargs={size: 7}"]).env.kwargs == {"size": 7}
    # a colon inside a quoted value is a value
    url = make_config(overrides=['env.kwargs={url: "http://host:1"}']).env.kwargs
    assert url == {"url": "http://host:1"}
