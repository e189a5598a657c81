"""The Spark settings of a node's session: iqgraph's, with the user's (--spark-conf) over them."""

from __future__ import annotations

from iqgraph.streaming.jvm_archive import java_options
from iqgraph.streaming.session import _base_conf, session_conf


def test_the_users_driver_jvm_options_are_added_to_the_log4j2_file_not_put_in_its_place() -> None:
    base = _base_conf("local[1]", 2, "1g")
    conf = session_conf(base, {"spark.driver.extraJavaOptions": " -Xss4m ", "spark.driver.memory": "2g"})
    options = conf["spark.driver.extraJavaOptions"].split()
    assert options[0].startswith("-Dlog4j2.configurationFile=") and options[-1] == "-Xss4m"
    assert options[1:-1] == java_options()  # the class archive's, when it is there
    assert conf["spark.driver.memory"] == "2g"  # any other setting: the user's value


def test_without_user_jvm_options_the_base_ones_stay() -> None:
    base = _base_conf("local[1]", 2, "1g")
    assert session_conf(base, {}) == base
    assert session_conf(base, {"spark.driver.extraJavaOptions": ""}) == base
