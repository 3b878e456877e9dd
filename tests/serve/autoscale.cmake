# The teachers' autoscaler (src/sinew/serve/autoscaler.*): its policy, and a real run against a private
# etcd that with_etcd.sh starts (SINEW_ETCD), with stand-in teacher processes that register themselves.
# Skipped (77) where etcd is not installed; RESOURCE_LOCK: one private etcd at a time.
add_test(NAME serve.autoscale
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/serve/with_etcd.sh $<TARGET_FILE:sinew_serve_tests>
                 --gtest_filter=Autoscale*)
set_tests_properties(serve.autoscale PROPERTIES TIMEOUT 180 LABELS "serve" SKIP_RETURN_CODE 77 RESOURCE_LOCK etcd)
