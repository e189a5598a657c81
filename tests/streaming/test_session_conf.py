"""The Spark settings of a node's session: iqgraph's, with the user's (--spark-conf) over them; its master."""

from __future__ import annotations

from iqgraph.streaming.session import LOCAL_TASK_ATTEMPTS, _base_conf, session_conf, with_task_retries


def test_the_users_driver_jvm_options_are_added_to_the_log4j2_file_not_put_in_its_place() -> None:
    base = _base_conf("local[1]", 2, "1g")
    conf = session_conf(base, {"spark.driver.extraJavaOptions": " -Xss4m ", "spark.driver.memory": "2g"})
    options = conf["spark.driver.extraJavaOptions"].split()
    assert options[0].startswith("-Dlog4j2.configurationFile=") and options[1:] == ["-Xss4m"]
    assert conf["spark.driver.memory"] == "2g"  # any other setting: the user's value


def test_without_user_jvm_options_the_base_ones_stay() -> None:
    base = _base_conf("local[1]", 2, "1g")
    assert session_conf(base, {}) == base
    assert session_conf(base, {"spark.driver.extraJavaOptions": ""}) == base


def test_a_local_master_tries_each_task_as_often_as_a_cluster_does_and_any_other_stays_as_given() -> None:
    assert LOCAL_TASK_ATTEMPTS == 4  # spark.task.maxFailures' default on a cluster
    assert with_task_retries("local") == "local[1,4]"
    assert with_task_retries("local[*]") == "local[*,4]"
    assert with_task_retries("local[2]") == "local[2,4]"
    assert with_task_retries("local[ 3 ]") == "local[3,4]"
    for given in ("local[2,1]", "local[*, 8]", "spark://10.0.0.5:7077", "local-cluster[2,1,1024]", "yarn"):
        assert with_task_retries(given) == given
