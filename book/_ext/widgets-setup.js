// Loaded before the ipywidgets HTML manager on pages with saved widget state (see _config.yml,
// nb_ipywidgets_js). Copied next to the vendored files by scripts/build-book.sh.
(function () {
  // The manager (embed-amd.js) defines AMD modules such as
  // "@jupyter-widgets/html-manager/dist/libembed-amd" and "@jupyter-widgets/base" and finds its
  // icon fonts relative to such a module's URL; without a mapping require.js puts those URLs
  // under the page's own folder (notebooks/@jupyter-widgets/...: 404).
  // A global `require` object defined before require.js loads is require.js's configuration.
  var here = document.currentScript && document.currentScript.src;
  if (here) {
    var managerDir = here.replace(/[?#].*$/, "").replace(/[^/]*$/, "html-manager");
    // Which module's URL the fonts are resolved against depends on load order, so map every
    // @jupyter-widgets module (require.js picks the longest matching prefix).
    window.require = {
      paths: {
        "@jupyter-widgets/html-manager/dist": managerDir,
        "@jupyter-widgets": managerDir,
      },
    };
    window.__jupyter_widgets_assets_path__ = managerDir + "/";
  }
  // ipywidgets 8 controls typeset their descriptions with the MathJax 2 call
  // MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]); the book loads MathJax 3, which has no Hub.
  function bridgeMathJax2() {
    var mj = window.MathJax;
    if (mj && !mj.Hub) {
      mj.Hub = {
        Queue: function (job) {
          var element = job && job[2];
          if (element && window.MathJax.typesetPromise) {
            window.MathJax.typesetPromise([element]).catch(function (err) { console.warn(err); });
          }
        },
      };
    }
  }
  bridgeMathJax2();
  document.addEventListener("DOMContentLoaded", bridgeMathJax2);
})();
