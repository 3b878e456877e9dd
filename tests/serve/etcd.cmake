# The etcd client (src/sinew/serve/etcd.*) against a real, private etcd that with_etcd.sh starts for the
# run (SINEW_ETCD names it). Skipped (77) where etcd is not installed. RESOURCE_LOCK: one private etcd at
# a time keeps the port scan of hpc/etcd/etcd.sh free of races.
add_test(NAME serve.etcd
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/with_etcd.sh $<TARGET_FILE:sinew_serve_tests> --gtest_filter=Etcd*)
set_tests_properties(serve.etcd PROPERTIES TIMEOUT 120 LABELS "serve" SKIP_RETURN_CODE 77 RESOURCE_LOCK etcd)
