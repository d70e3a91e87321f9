# median(list): the median of the numbers in a space-separated list (a leading space is
# fine), for the report tables of benches/http_load.sh and benches/cluster_latency.sh:
#   awk -f benches/median.awk -f /dev/stdin RESULTS <<'AWK' ... AWK
function median(list,    a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) {
        t = a[i]
        for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]
        a[j + 1] = t
    }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
