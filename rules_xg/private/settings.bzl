"""Build settings of rules_xg: the target GPU, the tuning policy, the tuning fan-out, XG's remote tier.

They are flags (`--//rules_xg:target=GB200`), set by the configs in `.bazelrc` (`--config=gb200`).
A value outside the allowed ones fails analysis, naming the value and listing the allowed ones.
"""

load(":providers.bzl", "XgSettingInfo")

def _string_setting_impl(ctx):
    value = ctx.build_setting_value
    allowed = ctx.attr.values
    if not allowed:
        return [XgSettingInfo(value = value)]
    for candidate in allowed:
        # GPU names are case-insensitive (`gb200` is `GB200`), as on xgc's command line.
        if candidate.lower() == value.lower():
            return [XgSettingInfo(value = candidate)]
    fail("%s: %s is not an allowed value; allowed: %s" % (
        ctx.label,
        repr(value),
        ", ".join([repr(v) if v else "\"\" (unset)" for v in allowed]),
    ))

xg_string_setting = rule(
    implementation = _string_setting_impl,
    build_setting = config.string(flag = True),
    attrs = {
        "values": attr.string_list(doc = "The allowed values (compared case-insensitively); empty: any."),
    },
    doc = "A string build setting whose value must be one of `values`.",
)

def _url_setting_impl(ctx):
    value = ctx.build_setting_value
    if value and not (value.startswith("http://") or value.startswith("https://")):
        fail("%s: %s is not an allowed value; allowed: an http:// or https:// URL, or \"\" (off)" % (
            ctx.label,
            repr(value),
        ))
    return [XgSettingInfo(value = value)]

xg_url_setting = rule(
    implementation = _url_setting_impl,
    build_setting = config.string(flag = True),
    doc = "A URL build setting: empty (off), or an http:// or https:// URL.",
)

def _int_setting_impl(ctx):
    value = ctx.build_setting_value
    if value < ctx.attr.min or value > ctx.attr.max:
        fail("%s: %d is out of range; allowed: %d to %d" % (ctx.label, value, ctx.attr.min, ctx.attr.max))
    return [XgSettingInfo(value = value)]

xg_int_setting = rule(
    implementation = _int_setting_impl,
    build_setting = config.int(flag = True),
    attrs = {
        "min": attr.int(default = 1, doc = "The smallest allowed value."),
        "max": attr.int(default = 256, doc = "The largest allowed value."),
    },
    doc = "An integer build setting within [min, max].",
)
