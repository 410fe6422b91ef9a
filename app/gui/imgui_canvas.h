// Our Qt <-> Dear ImGui bridge: a QOpenGLWidget that owns an ImGui context, feeds it Qt's input
// (mouse, wheel, keys, text, focus), display size and device pixel ratio, serves the clipboard
// through QClipboard, and draws ImGui's vertex lists with its own OpenGL 3.3 renderer. Input is
// queued and fed one button or key change per frame (ImGui 1.86 samples button state once a
// frame, so a press and release between two frames would be lost), and the widget draws only on
// input, on request or while animating: idle, it costs no CPU.
#pragma once

#include <QElapsedTimer>
#include <QOpenGLExtraFunctions>
#include <QOpenGLWidget>
#include <QPointF>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

struct ImGuiContext;
struct ImFont;
struct ImDrawData;

namespace kvlens::app {

class ImGuiCanvas : public QOpenGLWidget, protected QOpenGLExtraFunctions {
  Q_OBJECT

 public:
  explicit ImGuiCanvas(QWidget* parent = nullptr);
  ~ImGuiCanvas() override;

  // Called inside each frame, between ImGui::NewFrame and ImGui::Render, with the GL context
  // current (textures may be made there).
  void set_frame(std::function<void()> frame) { frame_ = std::move(frame); }

  // An RGBA8 texture of `width` x `height` pixels (nearest filtering: one data cell, one sharp
  // block), for ImGui::Image / AddImage; valid until release_textures(). Needs the context.
  void* make_texture(const uint8_t* rgba, int width, int height);
  void release_textures();

  ImFont* ui_font() const { return ui_font_; }
  ImFont* figure_font() const { return figure_font_; }
  // Frames drawn since the start, and the frames drawn over the last second (0 when idle).
  int64_t frames() const { return frames_; }
  double frames_per_second() const;
  bool wants_text_input() const;

  // At least `count` more frames (one already scheduled counts), even without input: after a
  // change the screen must show (a step recorded, a figure to rebuild). ImGui settles hover and
  // active states within two.
  void request_frames(int count = 2);
  // While on, a frame follows each frame (playback, a recording in progress).
  void set_animating(bool animating);
  bool animating() const { return animating_; }
  // Input received but not yet fed to ImGui (one button or key change goes in per frame).
  bool input_pending() const {
    return !input_.empty() || !keys_to_emit_.empty() || key_batches_in_flight_ > 0;
  }

  // The keys-and-gestures overlay (help_overlay.h), drawn over the frame while open: F1 or '?'
  // toggles it when no text field has the keyboard, Esc or a click outside closes it.
  void set_help_open(bool open);
  bool help_open() const { return help_open_; }

  // Where the last frame drew `text` as a word of its own (a button's label, say): the centre of
  // its glyphs in widget coordinates, for scripts that click controls by name.
  std::optional<QPointF> find_text(const QString& text) const;

 signals:
  // A key ImGui did not take (no text field active; F1, '?' and Esc over the help are the
  // canvas's own): the window's stepping shortcuts. Emitted after the frame that fed the key,
  // in the order the keys came.
  void unhandled_key(int key, Qt::KeyboardModifiers modifiers);
  // After each frame: where whoever drives animation (playback) says whether it goes on.
  void frame_drawn();

 protected:
  void initializeGL() override;
  void resizeGL(int width, int height) override;
  void paintGL() override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void keyReleaseEvent(QKeyEvent* event) override;
  void focusInEvent(QFocusEvent* event) override;
  void focusOutEvent(QFocusEvent* event) override;
  bool event(QEvent* event) override;

 private:
  void make_current_context() const;
  void build_fonts();
  void create_device_objects();
  void destroy_device_objects();
  void render_draw_data(ImDrawData* draw);
  // One input change as Qt reported it, waiting for its frame.
  struct Input {
    enum class Kind { MousePos, MouseButton, Wheel, Key, Focus };
    Kind kind = Kind::MousePos;
    int code = -1;  // ImGui mouse button or key (-1: a key ImGui does not know)
    bool down = false;
    float x = 0, y = 0;  // mouse position, or wheel steps
    Qt::KeyboardModifiers modifiers;
    int qt_key = 0;
    QString text;  // what a key press types
    static Input mouse_at(QPointF at, Qt::KeyboardModifiers modifiers) {
      Input input{Kind::MousePos};
      input.x = float(at.x());
      input.y = float(at.y());
      input.modifiers = modifiers;
      return input;
    }
  };
  void queue(Input input);
  // Moves queued input into ImGui up to the first change that needs a frame of its own: a button
  // or key that already changed in this frame, or a move after a button changed.
  void feed_input();
  void key_pressed(const Input& input);
  void key_event(QKeyEvent* event, bool down);
  void mouse_button(QMouseEvent* event, bool down);

  ImGuiContext* context_ = nullptr;
  bool gl_ready_ = false;  // an OpenGL context was made (not on platforms without one)
  ImFont* ui_font_ = nullptr;
  ImFont* figure_font_ = nullptr;
  std::function<void()> frame_;
  QElapsedTimer clock_;
  double last_frame_seconds_ = 0.0;
  int64_t frames_ = 0;
  std::deque<double> recent_frames_;  // when the frames of the last second were drawn
  std::deque<Input> input_;
  std::vector<std::pair<int, Qt::KeyboardModifiers>> keys_to_emit_;  // fed, not yet emitted
  int key_batches_in_flight_ = 0;  // emissions posted after a frame, not yet run
  int frames_wanted_ = 0;
  bool animating_ = false;
  bool help_open_ = false;
  qreal font_ratio_ = 0.0;  // the device pixel ratio the font atlas was built for
  std::string clipboard_;   // what GetClipboardText returns points here

  unsigned program_ = 0, vertex_buffer_ = 0, index_buffer_ = 0, vertex_array_ = 0;
  unsigned font_texture_ = 0;
  int projection_location_ = -1, texture_location_ = -1;
  std::vector<unsigned> textures_;
};

}  // namespace kvlens::app
